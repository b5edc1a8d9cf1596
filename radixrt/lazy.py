"""Lazy package attributes (PEP 562), so that importing a package does not import what its names need
(the server's main and detokenizer processes must not load torch through a package ``__init__``)."""

from __future__ import annotations

from importlib import import_module
from typing import Callable


def lazy_getattr(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``where[name]`` (a module path) on first use of
    ``name``. Raises AttributeError naming the package for any other name."""

    def __getattr__(name: str):
        if name in where:
            return getattr(import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
