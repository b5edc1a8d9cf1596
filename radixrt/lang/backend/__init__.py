"""DSL backends: ``RuntimeEndpoint`` (ZMQ ``tcp://`` or HTTP ``http://``), ``EngineBackend`` (in-process),
``OpenAI`` (any OpenAI-compatible server)."""

from __future__ import annotations

from radixrt.lang.backend.base import BackendConnectionError, BackendError, BaseBackend, RequestError
from radixrt.lang.backend.runtime_endpoint import RuntimeEndpoint

__all__ = [
    "BaseBackend",
    "RuntimeEndpoint",
    "BackendError",
    "BackendConnectionError",
    "RequestError",
    "EngineBackend",
    "OpenAI",
]


def __getattr__(name: str):  # lazy: importing the DSL must not import torch or openai
    if name == "EngineBackend":
        from radixrt.lang.backend.engine import EngineBackend

        return EngineBackend
    if name == "OpenAI":
        from radixrt.lang.backend.openai import OpenAI

        return OpenAI
    raise AttributeError(name)
