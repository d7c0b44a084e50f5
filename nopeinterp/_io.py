"""Writing files: the package's one atomic write, and the versions recorded in what it saves.

`atomic_write` writes through a temporary file in the destination's folder and renames it
into place, so a crash mid-write never leaves a half-written file. The file gets mode 0666
filtered by the process umask (what `open(path, "w")` gives), not mkstemp's 0600: the
temporary file is created with that mode by the kernel, and the mode is set again after the
writer ran, since some writers (safetensors) replace the file they are given.
"""

from __future__ import annotations

import os
import platform
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from nopeinterp.errors import NopeinterpError


class OutputError(NopeinterpError, OSError):
    """An output file or folder that cannot be written (names the path and the reason)."""


def _temporary(path: Path) -> tuple[Path, int]:
    """A new empty file next to `path` (O_EXCL: never an existing one) and its mode.

    Created with 0666, so the kernel applies the umask: the mode is what `open(path, "w")`
    would give, without reading the process-wide umask.
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            return tmp, stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
    raise FileExistsError(f"{path}: could not create a temporary file next to it")


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Create `path` by calling `write(tmp)` on a temporary path, then renaming it into place.

    `write` receives the temporary file's name (a str) and writes the whole content to it
    (e.g. `lambda t: torch.save(obj, t)`). The parent folder is created if needed. If `write`
    raises, the temporary file is removed and the exception propagates; an OSError from the
    file system (unwritable folder, name too long, a folder in the way) is re-raised as
    `OutputError` naming `path`.
    """
    path = Path(path)
    tmp = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise OutputError(f"{path}: cannot write (Not a directory: {path.parent})") from None
        tmp, mode = _temporary(path)
        write(str(tmp))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, NopeinterpError):
            raise OutputError(f"{path}: cannot write ({e.strerror or e})") from e
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path."""
    return atomic_write(path, lambda t: Path(t).write_text(text, encoding="utf-8"))


class _Recorded:
    """A binary file that remembers the first OSError of its writes (torch's writer turns
    one, e.g. a full disk, into a RuntimeError that does not say what failed)."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data):
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self):
        return self.file.flush()


def atomic_write_torch(path: str | os.PathLike, obj) -> Path:
    """`torch.save(obj)` to `path` atomically; a file-system failure is an `OutputError`
    naming `path` and the reason (e.g. no space left on device)."""
    import torch

    def write(tmp):
        with open(tmp, "wb") as f:
            recorded = _Recorded(f)
            try:
                torch.save(obj, recorded)
            except RuntimeError:
                if recorded.error is not None:
                    raise recorded.error from None
                raise

    return atomic_write(path, write)


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap two existing paths in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`): no
    moment where either name is missing. False, with nothing changed, where the system or
    file system cannot (then the caller renames in two steps)."""
    import ctypes
    import errno

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))


class HeldLock:
    """An exclusive OS lock on a file, held until `release()` (which also removes the file,
    so no empty lock file stays behind)."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is None:
            return
        # removed while still locked: a process that opened the file meanwhile and gets the
        # lock after us sees that its file is no longer at `path` and tries again
        self.path.unlink(missing_ok=True)
        os.close(self._fd)  # closing releases the lock
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def try_lock(path: str | os.PathLike) -> HeldLock | None:
    """Take an exclusive lock on `path` (created if missing) without waiting: a `HeldLock`,
    or None when another holder has it (another process, or another `try_lock` here). The
    lock is the operating system's (flock), so a killed holder never leaves it taken."""
    import fcntl

    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return HeldLock(path, fd)
        os.close(fd)  # the holder before us removed this file on release: lock the new one


def versions() -> dict[str, str]:
    """Versions of Python and the packages whose behaviour a saved result depends on.

    Read from the installed distributions' metadata (TransformerLens 3.9 has no
    `__version__`), so recording them imports nothing.
    """
    from importlib.metadata import PackageNotFoundError, version

    import nopeinterp

    out = {"nopeinterp": nopeinterp.__version__, "python": platform.python_version()}
    for name, dist in (("torch", "torch"), ("transformer_lens", "transformer-lens")):
        try:
            out[name] = version(dist)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
