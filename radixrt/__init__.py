"""radixrt: a prefix-caching agent runtime (radix tree of KV pages, constrained decoding, a DSL)."""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: `import radixrt` stays cheap and never imports torch-heavy modules until used.
    if name == "Engine":
        from radixrt.runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from radixrt.runtime.config import ServerArgs

        return ServerArgs
    if name == "SamplingParams":
        from radixrt.runtime.io_struct import SamplingParams

        return SamplingParams
    import radixrt.lang.api as _api

    if hasattr(_api, name):
        return getattr(_api, name)
    raise AttributeError(f"module 'radixrt' has no attribute {name!r}")
