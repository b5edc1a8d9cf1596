"""The supervisor and admission control of ``radixrt serve``, on a real server with real kill -9s.

One server (``--max-restarts 2``, a bound of 3 requests in flight) for the module, in any order: a 10 MB
body (413), the bound (503 + Retry-After), kill -9 of the scheduler mid-stream (error event naming it, /health 503 then
200, same greedy tokens as before, its session reported closed), kill -9 of the detokenizer; each kill test
counts the restarts from what the server reported when it began (the two kills are the module server's only
restarts, within its limit). A death beyond the limit (the server stays down, and says so) has a server of
its own (``--max-restarts 1``: one restart, then the second death is beyond it).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from server_util import sse_events, start_server

PROMPT = "The capital of France is"
GREEDY = {"max_new_tokens": 12, "temperature": 0}
LONG = {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    s = start_server(
        "--enable-metrics", "--max-restarts", "2", "--max-running-requests", "2", "--max-queued-requests", "1"
    )
    try:
        yield s
    finally:
        rc = s.stop()  # raises if anything of its process group survives
    assert rc == 0, s.logs()


def _pid(c, name: str) -> int:
    return c.get("/get_server_info").json()["process_ids"][name]


def _wait_health(c, timeout: float = 120) -> tuple[list[int], float]:
    """Poll /health until 200; returns the codes seen and the seconds it took."""
    t0, codes = time.monotonic(), []
    while True:
        codes.append(c.get("/health").status_code)
        if codes[-1] == 200:
            return codes, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, codes[-5:]
        time.sleep(0.1)


def _restarts_metric(c, process: str) -> float:
    """radixrt:process_restarts_total of ``process`` (0 before its first restart: no sample yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
    fam = fams.get("radixrt:process_restarts")
    return next(
        (
            s.value
            for s in (fam.samples if fam else ())
            if s.name == "radixrt:process_restarts_total" and s.labels["process"] == process
        ),
        0.0,
    )


def _restarts(c) -> tuple[dict, dict]:
    """The restarts the server reports (/get_server_info) and its restart metric, per process."""
    info = c.get("/get_server_info").json()["restarts"]
    return info, {p: _restarts_metric(c, p) for p in ("scheduler", "detokenizer")}


def _one_more(counts: dict, process: str) -> dict:
    return {**counts, process: counts.get(process, 0) + 1}


def _kill_mid_stream(server, c, name: str) -> tuple[list, int]:
    """Start a long stream, kill -9 child ``name`` after its first event; returns the rest and the pid."""
    pid = _pid(c, name)
    with c.stream("POST", "/generate", json={"text": PROMPT, "stream": True, "sampling_params": LONG}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        os.kill(pid, signal.SIGKILL)
        rest = sse_events(lines)
    return rest, pid


def test_big_body_is_413(server):
    big = b'{"text": "' + b"a" * (10 << 20) + b'"}'
    too_large = {
        "error": {
            "message": "the request body is larger than 8388608 bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    with server.client() as c:
        r = c.post("/generate", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json() == too_large
        r = c.post("/v1/chat/completions", content=iter([big[i : i + (1 << 20)] for i in range(0, len(big), 1 << 20)]))
        assert r.status_code == 413 and r.json() == too_large  # chunked: no Content-Length
        r = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 12


def test_queue_bound_is_503_with_retry_after(server):
    with server.client() as c:
        rids = [f"bound-{i}" for i in range(3)]
        streams = [
            c.stream("POST", "/generate", json={"text": PROMPT, "stream": True, "rid": rid, "sampling_params": LONG})
            for rid in rids
        ]
        opened = [s.__enter__() for s in streams]
        try:
            # each is submitted once its headers are back: 3 x 200 tokens, 2 at a time, take seconds
            assert [r.status_code for r in opened] == [200] * 3
            r = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json() == {
                "error": {
                    "message": "the server is at capacity: 3 requests in flight, at most 3 (--max-running-requests 2"
                    " + --max-queued-requests 1); retry after 1 s",
                    "type": "service_unavailable",
                    "param": None,
                    "code": "queue_full",
                }
            }
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
            # a prompt that can never fit is still a 400 at once, not a 503
            r = c.post("/generate", json={"input_ids": [1] * 300, "sampling_params": GREEDY})
            assert r.status_code == 400, r.text
            # so is a call whose choices alone exceed the bound: retrying its 503 would never succeed
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "n": 4})
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
            assert r.json()["error"]["message"].startswith("n: this call makes 4 requests (prompts x n), more ")
        finally:
            for rid in rids:
                c.post("/abort_request", json={"rid": rid})
            for s in streams:
                s.__exit__(None, None, None)
        server.wait_idle()
        # the main process drops an aborted stream's state when its handler unwinds, which may trail the
        # scheduler's idle by a moment: the bound frees within a second, never stays full
        deadline = time.monotonic() + 10
        while (
            code := c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).status_code
        ) == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert code == 200


def test_scheduler_kill_restarts(server):
    with server.client() as c:
        info0, metric0 = _restarts(c)
        before = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).json()
        sid = c.post("/open_session", json={"capacity_of_str_len": 1000}).json()
        rest, pid = _kill_mid_stream(server, c, "scheduler")
        msg = (
            "the scheduler process exited unexpectedly (exit code -9); restarting it, retry when "
            "GET /health returns 200"
        )
        assert rest[-1] == "[DONE]" and rest[-2] == {
            "error": {"message": msg, "type": "service_unavailable", "param": None, "code": None}
        }
        r = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
        assert r.status_code == 503 and r.json()["error"]["message"] == msg
        codes, took = _wait_health(c)
        assert codes[0] == 503, codes
        after = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY}).json()
        assert after["output_ids"] == before["output_ids"] and after["text"] == before["text"]
        info = c.get("/get_server_info").json()
        assert info["process_ids"]["scheduler"] != pid
        assert info["restarts"] == _one_more(info0, "scheduler")
        assert _restarts(c)[1] == _one_more(metric0, "scheduler")
        # the session lived in the dead scheduler: reported closed
        r = c.post("/generate", json={"text": "hi", "session_params": {"id": sid}, "sampling_params": GREEDY})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_params", r.text
        assert c.post("/close_session", json={"session_id": sid}).json() == {"success": False}
        server.wait_idle()
    print(f"scheduler back after {took:.1f} s")


def test_detokenizer_kill_restarts(server):
    with server.client() as c:
        info0, metric0 = _restarts(c)
        rest, pid = _kill_mid_stream(server, c, "detokenizer")
        assert rest[-1] == "[DONE]"
        assert rest[-2]["error"]["message"] == (
            "the detokenizer process exited unexpectedly (exit code -9); restarting it, retry when "
            "GET /health returns 200"
        )
        _wait_health(c)
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        info = c.get("/get_server_info").json()
        assert info["process_ids"]["detokenizer"] != pid
        assert info["restarts"] == _one_more(info0, "detokenizer")
        assert _restarts(c)[1] == _one_more(metric0, "detokenizer")
        server.wait_idle()


@pytest.fixture
def limited_server():
    """A server of its own for the death beyond --max-restarts (it stays down): no other test meets it."""
    s = start_server("--max-restarts", "1")
    try:
        yield s
    finally:
        s.stop()  # raises if anything of its process group survives


def test_restart_limit_leaves_the_server_down(limited_server):
    """The second death within 10 min is beyond --max-restarts 1: the first is restarted, the second not."""
    server = limited_server
    with server.client() as c:
        rest, _ = _kill_mid_stream(server, c, "scheduler")
        assert "restarting it" in rest[-2]["error"]["message"]
        _wait_health(c)
        assert c.get("/get_server_info").json()["restarts"] == {"scheduler": 1}
        old = c.get("/get_server_info").json()["process_ids"]
        os.kill(old["scheduler"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (r := c.get("/health")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        msg = (
            "the scheduler process exited unexpectedly (exit code -9); not restarted: 1 restarts in the last "
            "10 min reached --max-restarts 1; the server stays down until it is restarted"
        )
        assert r.json()["error"]["message"] == msg
        # the supervisor gave up (it logs so when it decides, with the same message /health now answers): no
        # restart can come after that, so /health keeps saying so
        deadline = time.monotonic() + 30
        while msg not in server.logs():
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.05)
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == msg
        r = c.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
        assert r.status_code == 503 and r.json()["error"]["message"] == msg
    with pytest.raises(ProcessLookupError):
        os.kill(old["scheduler"], 0)
