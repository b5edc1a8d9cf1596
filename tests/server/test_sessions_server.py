"""Agent sessions over a real server (issue 15, part 1): SGLang's /open_session, /close_session and
session_params; the OpenAI routes' X-Session-Id; a DSL program run's automatic session.

The pool is 32 pages of 16 tokens; three one-off requests of 200 + 8 random tokens between an agent's calls
evict its history under LRU (see test_sessions.py for the page arithmetic)."""

from __future__ import annotations

import random
import time

import pytest

import radixrt as rt
from server_util import ServerProc

P = 16
G = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--max-total-tokens", str(32 * P), "--page-size", str(P), "--chunked-prefill-size", "256")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def gen(c, **body) -> dict:
    r = c.post("/generate", json={"sampling_params": G, **body})
    assert r.status_code == 200, r.text
    return r.json()


def other_traffic(c, seed: int) -> None:
    for i in range(3):
        gen(c, input_ids=ids(seed * 100 + i, 200))


def idle_stats(server, timeout: float = 60) -> dict:
    """The cache stats once idle (pinned pages allowed, unlike ServerProc.wait_idle); checks the accounting."""
    deadline = time.time() + timeout
    with server.client() as c:
        while True:
            info = c.get("/get_server_info").json()
            if info["num_running"] == 0 and info["num_waiting"] == 0:
                break
            assert time.time() < deadline, info
            time.sleep(0.05)
    st = info["cache"]
    assert st["private_pages"] == 0
    assert st["free_pages"] + st["evictable_pages"] + st["protected_pages"] == st["total_pages"]
    return st


def test_native_sessions(server):
    with server.client() as c:
        c.post("/flush_cache")
        prompt = ids(1, 104)
        a1 = gen(c, input_ids=prompt)
        other_traffic(c, 1)
        miss = gen(c, input_ids=prompt + a1["output_ids"] + ids(2, 12))
        assert miss["meta_info"]["cached_tokens"] == 0
        c.post("/flush_cache")

        r = c.post("/open_session", json={"capacity_of_str_len": 4096, "session_id": "agent-1"})
        assert r.status_code == 200 and r.json() == "agent-1"
        dup = c.post("/open_session", json={"capacity_of_str_len": 4096, "session_id": "agent-1"})
        assert dup.status_code == 400 and dup.json()["error"]["param"] == "session_id"
        b1 = gen(c, input_ids=prompt, session_params={"id": "agent-1"})
        other_traffic(c, 1)
        b2 = gen(c, input_ids=ids(2, 12), session_params={"id": "agent-1"})  # only the new tokens
        assert b2["meta_info"]["prompt_tokens"] == 124
        assert b2["meta_info"]["cached_tokens"] == 96 == (112 - 1) // P * P
        assert b2["output_ids"] == miss["output_ids"]
        st = idle_stats(server)
        assert st["pinned_tokens"] == 128 and st["protected_pages"] == 8

        # OpenAI route: the header names the session; the prompt holds the whole history
        hist = prompt + b1["output_ids"] + ids(2, 12) + b2["output_ids"]
        other_traffic(c, 3)
        r = c.post(
            "/v1/completions",
            headers={"X-Session-Id": "agent-1"},
            json={"prompt": hist + ids(4, 5), "max_tokens": 4, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 128
        bad = c.post("/v1/completions", headers={"X-Session-Id": "nope"}, json={"prompt": [5, 6], "max_tokens": 1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
        for offset in ("x", -5):
            bad = c.post("/generate", json={"input_ids": [5], "session_params": {"id": "agent-1", "offset": offset}})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_params"
        # refused by the scheduler (it holds the history): still a 400 naming the field, stream or not
        bad = c.post("/generate", json={"input_ids": [5], "session_params": {"id": "agent-1", "rid": "nope"}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_params", bad.text
        assert "no finished request 'nope'" in bad.json()["error"]["message"]
        assert c.post("/open_session", json={"capacity_of_str_len": 3, "session_id": "cap3"}).status_code == 200
        bad = c.post("/v1/completions", json={"prompt": [5, 6, 7, 8], "max_tokens": 1, "session_id": "cap3"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id", bad.text
        assert "exceeds the session's capacity_of_str_len (3)" in bad.json()["error"]["message"]
        with c.stream(  # streamed, still a 400 before any event (the status line waits for the first output)
            "POST", "/generate", json={"input_ids": [5, 6, 7, 8], "stream": True, "session_params": {"id": "cap3"}}
        ) as r:
            r.read()
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_params", r.text
        assert c.post("/close_session", json={"session_id": "cap3"}).json() == {"success": True}
        for body, param in (({}, "capacity_of_str_len"), ({"capacity_of_str_len": 1, "ttl": 5}, "ttl")):
            bad = c.post("/open_session", json=body)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text

        assert c.post("/close_session", json={"session_id": "agent-1"}).json() == {"success": True}
        assert c.post("/close_session", json={"session_id": "agent-1"}).json() == {"success": False}
    st = idle_stats(server)
    assert st["protected_pages"] == 0 and st["num_sessions"] == 0


def test_dsl_program_session(server):
    """A DSL program's own tool call (other traffic) runs between its two gens. With the run's automatic
    session the second gen hits the first's whole sequence; with ``use_session=False`` it misses."""
    backend = rt.RuntimeEndpoint(server.zmq_url)
    tok = backend.get_tokenizer()
    words = " ".join(f"w{i}" for i in range(60))

    @rt.function
    def agent(s, k):
        s += f"Notes {k}: {words}."
        s += rt.gen("a", max_tokens=8, temperature=0, ignore_eos=True, return_logprob=True)
        s["a"]  # wait for it: the tool needs the answer
        with server.client() as c:
            other_traffic(c, 10 + k)
        s += " Tool: done."
        s += rt.gen("b", max_tokens=4, temperature=0, ignore_eos=True)

    with server.client() as c:
        c.post("/flush_cache")
    try:
        for use in (False, True):
            st = agent.run(k=int(use), backend=backend, use_session=use)
            assert st.error() is None, st.error()
            text1 = f"Notes {int(use)}: {words}."
            seq1 = tok.encode(text1, add_special_tokens=False) + [
                t for _, t, _ in st.get_meta_info("a")["output_token_logprobs"]
            ]
            ids2 = tok.encode(text1 + st["a"] + " Tool: done.", add_special_tokens=False)
            k1 = (len(seq1) - 1) // P * P
            n = 0
            while n < min(k1, len(ids2) - 1) and ids2[n] == seq1[n]:
                n += 1
            hit = n // P * P
            assert hit >= 64
            assert st.get_meta_info("b")["cached_tokens"] == (hit if use else 0)
        st = idle_stats(server)
        assert st["num_sessions"] == 0 and st["protected_pages"] == 0
    finally:
        backend.close()
