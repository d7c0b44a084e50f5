"""Lazy package exports: `name -> module` resolved on first access (PEP 562), so importing a
package (and `nopeinterp --help`) does not load torch or TransformerLens."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """(`__getattr__`, `__dir__`) for a package whose `exports` map a name to its module."""

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted([*importlib.import_module(package).__dict__, *exports])

    return __getattr__, __dir__
