"""The shared part of the two ``radixrt serve`` clients (ZMQ and HTTP): connect, ask for the model, load
its tokenizer locally."""

from __future__ import annotations

import logging
from typing import Any, Optional

from radixrt.lang.backend.base import BaseBackend

logger = logging.getLogger(__name__)


class RemoteEndpoint(BaseBackend):
    """A running ``radixrt serve``, reached over a transport a subclass provides: ZMQ to the DSL socket
    (:class:`radixrt.lang.backend.zmq.ZmqEndpoint`) or the native HTTP API
    (:class:`radixrt.lang.backend.http.HttpEndpoint`). Build one with
    :func:`radixrt.lang.backend.runtime_endpoint.RuntimeEndpoint`, which picks the transport by URL scheme.

    The constructor asks the server for its model (``get_model_info``) and fails fast when it is down.
    The tokenizer (for chat templates and ``select`` boundaries) is loaded locally from the server's
    ``tokenizer_path`` with :func:`radixrt.runtime.models.loader.load_tokenizer`, so nothing is downloaded;
    if that fails, roles render as ChatML and ``select`` tokenizes on the server.

    Args:
        base_url: ``tcp://`` or ``http(s)://`` URL.
        api_key: for a server started with ``--api-key`` (HTTP: ``Authorization: Bearer``; ZMQ: in each
            ``DslRequest``).
        timeout: seconds to wait for a reply (for a stream: between two chunks) before giving up.
        connect_timeout: seconds the first contact may take.

    Raises:
        BackendConnectionError: the server did not answer within ``connect_timeout``.
    """

    def __init__(
        self,
        base_url: str = "tcp://127.0.0.1:30001",
        api_key: Optional[str] = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
    ) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.api_key, self.timeout, self.connect_timeout = api_key, timeout, connect_timeout
        self._connect()
        self.model_info = self._info("get_model_info", connect_timeout)

    def _connect(self) -> None:
        """Open the transport (no network traffic needed)."""

    def _info(self, op: str, timeout: Optional[float] = None) -> Any:
        raise NotImplementedError

    def get_model_info(self) -> dict:
        return self._info("get_model_info")

    def get_server_info(self) -> dict:
        return self._info("get_server_info")

    def _load_tokenizer(self) -> Any:
        from radixrt.runtime.models.loader import load_tokenizer

        for key in ("tokenizer_path", "model_path"):
            try:
                return load_tokenizer(self.model_info.get(key))
            except Exception as e:  # noqa: BLE001 - fall back, as documented
                logger.warning("cannot load the tokenizer %r locally: %s", self.model_info.get(key), e)
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"
