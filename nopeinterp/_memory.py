"""Give freed heap memory back to the operating system, where the C library can.

glibc keeps freed blocks below its mmap threshold (up to 32 MiB once it has adapted) in the
heap, so after a forward pass over a long batch the process's RSS still counts its
temporaries. `malloc_trim(0)` returns those pages; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the OS (between batches of a long forward pass)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
