"""The error user-input validation raises: a ``ValueError`` that knows which field is at fault.

Raised where the check is made (``sampling/params.py``, ``validation.py``, the server's body parsing), so
callers never have to guess the field from the message: the HTTP layer answers a 400 whose OpenAI error
body carries ``param``; Python callers can keep catching ``ValueError``.
"""
from __future__ import annotations

from typing import Optional


class ValidationError(ValueError):
    """Bad user input. ``param`` names the field (``"max_new_tokens"``, ``"text"``, ``"regex"`` ...), or is
    None when no single field is at fault."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param
