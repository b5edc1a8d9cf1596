"""One module-scoped ``radixrt serve`` per test module, checked idle after every test, and a client for it.

``srv, _idle, oai = server_fixtures("--context-length", "1024")`` at module level defines the fixtures
``srv`` (a ready :class:`server_util.ServerProc`, stopped with exit status 0 at the end of the module),
``_idle`` (autouse: after each test, no request running and the page pool balanced with no lock held) and
a client fixture (``oai``: ``openai.OpenAI``; ``client="anthropic"`` gives ``cl``: ``anthropic.Anthropic``).
A CLI argument may be a callable ``(request) -> str``, for flags that name another fixture's value.
"""

from __future__ import annotations

import pytest

from server_util import start_server


def server_fixtures(*args, api_key: str | None = None, client: str = "openai"):
    """The ``(srv, _idle, client)`` fixtures described in the module doc."""

    @pytest.fixture(scope="module", name="srv")
    def srv_fixture(request):
        s = start_server(*(a(request) if callable(a) else a for a in args), api_key=api_key)
        yield s
        assert s.stop() == 0, s.logs()

    @pytest.fixture(autouse=True, name="_idle")
    def idle_fixture(srv):
        yield
        srv.wait_idle()

    if client == "anthropic":

        @pytest.fixture(scope="module", name="cl")
        def client_fixture(srv):
            import anthropic

            return anthropic.Anthropic(base_url=srv.url, api_key=api_key or "unused", max_retries=0, timeout=300)
    else:

        @pytest.fixture(scope="module", name="oai")
        def client_fixture(srv):
            import openai

            return openai.OpenAI(base_url=srv.url + "/v1", api_key=api_key or "unused", max_retries=0, timeout=300)

    return srv_fixture, idle_fixture, client_fixture
