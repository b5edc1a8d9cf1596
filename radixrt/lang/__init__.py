"""radixrt's frontend DSL (SGLang's frontend language): see :mod:`radixrt.lang.api`."""

from __future__ import annotations

from typing import Any

from radixrt.lang.api import *  # noqa: F401,F403
from radixrt.lang.api import __all__  # noqa: F401


def __getattr__(name: str) -> Any:
    from radixrt.lang import api

    return getattr(api, name)
