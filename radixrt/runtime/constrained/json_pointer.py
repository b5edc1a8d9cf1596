"""RFC 6901 JSON pointers: a path of keys <-> ``"/a/b~1c"`` (``~`` is written ``~0``, ``/`` is ``~1``)."""

from __future__ import annotations


def json_pointer(path: list[str]) -> str:
    """The pointer of ``path``; the root (``[]``) is ``""``, as RFC 6901 says (messages show it as "/")."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def split_pointer(ptr: str) -> list[str]:
    """The keys of pointer ``ptr`` (``""`` -> ``[]``); the inverse of :func:`json_pointer`."""
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:]] if ptr else []
