"""Shared by test_lang.py and test_examples.py: ONE ``radixrt serve`` process for the whole session
(context 1024, KV pool 8192 tokens, one torch thread), started while the in-process engine loads and
stopped at session end by the teardown of the session fixtures that use it (:func:`stop_server`), before
conftest's check that nothing a test started is still running."""

from __future__ import annotations

from typing import Any, Optional

from server_util import ROOT, ServerProc

__all__ = ["ROOT", "start_server", "stop_server", "endpoint", "page_floor", "common_prefix"]

PAGE = 16
_server: Optional[ServerProc] = None
_endpoints: dict[str, Any] = {}


def start_server(config: Any) -> ServerProc:
    """Launch the server (does not wait); a session fixture that calls this calls :func:`stop_server` in its
    teardown (``config.add_cleanup`` stops it too, as a last resort: that runs after conftest's check)."""
    global _server
    if _server is None:
        # One torch thread: the test process (in-process engine, HF model) shares the cores, and
        # oversubscribed OpenMP threads make every step many times slower.
        _server = ServerProc("--context-length", "1024", "--num-threads", "1")
        config.add_cleanup(stop_server)
    return _server


def stop_server() -> None:
    """Close the endpoints and stop the server (its exit status must be 0); nothing when none runs."""
    global _server
    for b in _endpoints.values():
        b.close()
    _endpoints.clear()
    if _server is not None:
        s, _server = _server, None
        try:
            s.wait_idle()
        finally:
            rc = s.stop()  # raises if anything of its process group survives
        assert rc == 0, s.logs()


def endpoint(kind: str) -> Any:
    """The session's RuntimeEndpoint over ``zmq`` or ``http`` (the server must be ready)."""
    import radixrt as rt

    assert _server is not None
    if kind not in _endpoints:
        _endpoints[kind] = rt.RuntimeEndpoint(_server.zmq_url if kind == "zmq" else _server.url)
    return _endpoints[kind]


def page_floor(n: int) -> int:
    """Tokens of a cached prefix of ``n`` tokens that the radix cache (whole pages) can return."""
    return n // PAGE * PAGE


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
