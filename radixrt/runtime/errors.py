"""The error user-input validation raises: a ``ValueError`` that knows which field is at fault.

Raised where the check is made (``sampling/params.py``, ``validation.py``, the server's body parsing), so
callers never have to guess the field from the message: the HTTP layer answers a 400 whose OpenAI error
body carries ``param``; Python callers can keep catching ``ValueError``.
"""

from __future__ import annotations

from typing import Optional

from radixrt.runtime.io_struct import FinishError


class ValidationError(ValueError):
    """Bad user input. ``param`` names the field (``"max_new_tokens"``, ``"text"``, ``"regex"`` ...), or is
    None when no single field is at fault."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def refusal(error: ValueError) -> FinishError:
    """The finish reason of a request the scheduler refuses for bad input (SGLang's FINISH_ABORT with a 400
    status code), carrying the field; :func:`refused` turns it back into the error."""
    return FinishError(str(error), 400, error.param if isinstance(error, ValidationError) else None)


def grammar_refusal(grammar: Optional[tuple[str, str]], why: str) -> FinishError:
    """A grammar the backend could not build or start (a limit of its lexer or parser, met only once it
    runs): a 400 naming the request's grammar field, ``grammar[0]`` (``sampling.params.grammar_of``:
    ``json_schema``, ``regex``, ``ebnf`` or ``structural_tag``)."""
    field = grammar[0] if grammar is not None else "grammar"
    why = why.split("<state>")[0].strip().splitlines()[0][:200] if why.strip() else why  # not llguidance's dump
    return refusal(ValidationError(f"{field}: the grammar cannot be used: {why}", field))


def refused(reason) -> Optional[ValidationError]:
    """The ValidationError a finish reason made by :func:`refusal` stands for, else None."""
    if isinstance(reason, FinishError):
        return ValidationError(reason.message, reason.param)
    return None
