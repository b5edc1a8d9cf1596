"""``RuntimeEndpoint(url)``: a client of a running ``radixrt serve``, its transport picked by URL scheme."""

from __future__ import annotations

from typing import Any

from radixrt.lang.backend.remote import RemoteEndpoint


def RuntimeEndpoint(base_url: str = "tcp://127.0.0.1:30001", *args: Any, **kwargs: Any) -> RemoteEndpoint:  # noqa: N802
    """SGLang's spelling: ``RuntimeEndpoint("tcp://host:port")`` speaks ZMQ to the DSL socket (the default,
    HTTP port + 1); ``RuntimeEndpoint("http://host:port")`` the native HTTP API. The other arguments are
    :class:`RemoteEndpoint`'s (``api_key``, ``timeout``, ``connect_timeout``).

    Raises:
        ValueError: ``base_url`` is not a string, or its scheme is neither tcp:// nor http(s)://.
        BackendConnectionError: the server did not answer within ``connect_timeout``.
    """
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a string, got {base_url!r}")
    if base_url.startswith("tcp://"):
        from radixrt.lang.backend.zmq import ZmqEndpoint  # lazy: an HTTP client never imports zmq, and back

        return ZmqEndpoint(base_url, *args, **kwargs)
    if base_url.startswith(("http://", "https://")):
        from radixrt.lang.backend.http import HttpEndpoint

        return HttpEndpoint(base_url, *args, **kwargs)
    raise ValueError(f"base_url must start with tcp:// (ZMQ) or http(s):// (HTTP), got {base_url!r}")
