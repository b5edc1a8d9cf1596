"""Tracing: find the constant text a program produces before anything depends on its arguments.

``run_batch`` runs the program once with :class:`Placeholder` arguments on a tracing state: constant text
and roles are rendered as usual, and the first use of an argument (formatting it, appending it, comparing
it...), the first ``gen``/``select``/``fork`` or variable read stops the trace. The text so far is the
prefix every program of the batch shares; it is prefilled once, before the batch, so that every program's
first request finds it in the radix cache (:func:`radixrt.lang.program.extract_prefix` runs the trace).
"""

from __future__ import annotations

import inspect
from typing import Any, NoReturn


class StopTrace(Exception):
    """Raised at the first argument-dependent step of a traced program."""


class Placeholder:
    """Stands for a program argument while tracing; any use of its value stops the trace (so its name is
    read with :func:`argument_name`, not as an attribute)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StopTrace(self._name)

    __str__ = __format__ = __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _stop
    __getitem__ = __iter__ = __len__ = __bool__ = __int__ = __float__ = __index__ = __call__ = _stop
    __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __truediv__ = __sub__ = __neg__ = _stop

    def __eq__(self, other: object) -> bool:
        self._stop()

    def __ne__(self, other: object) -> bool:
        self._stop()

    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        raise StopTrace(self._name)

    def __repr__(self) -> str:
        return f"<argument {self._name}>"


def argument_name(p: Placeholder) -> str:
    """The program argument ``p`` stands for."""
    return p._name


def placeholders(func: Any, bound: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for tracing ``func(s, ...)``: a placeholder per parameter after ``s``."""
    params = list(inspect.signature(func).parameters.values())[1:]
    out: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[p.name] = bound[p.name] if p.name in bound else Placeholder(p.name)
    return out
