"""Agent sessions (issue 15, part 1): a session pins its history's KV while the agent's tool runs.

The pool is 32 pages of 16 tokens. The agent's first call (104 + 8 tokens) leaves 6 full pages of history in
the tree; three one-off requests of 200 + 8 tokens then need 13 pages each and leave 12 cached, so LRU evicts
the agent's history unless a session pins it.
"""

from __future__ import annotations

import contextlib
import random
import time

import pytest

from conftest import close_engine, make_engine, wait_idle

P = 16
G = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


@pytest.fixture(scope="module")
def small():
    e = make_engine(max_total_tokens=32 * P, page_size=P, chunked_prefill_size=256)
    yield e
    close_engine(e)


class FakeClock:
    """The sessions' clock (``SessionManager.clock``, time.monotonic by default), moved by the test: a TTL
    runs out when the test says so, not after real seconds."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def fake_clock(e):
    """Give ``e``'s sessions a FakeClock (set on the engine's thread) for the block; the real one after."""
    sessions, clock = e.scheduler.sessions, FakeClock()
    real = sessions.clock
    e._call(lambda: setattr(sessions, "clock", clock))
    try:
        yield clock
    finally:
        e._call(lambda: setattr(sessions, "clock", real))


def expired_now(e) -> int:
    """Run the expiry on the engine's thread at once: how many sessions it closed."""
    return e._call(e.scheduler.sessions.expire)


def sessions_left(e, n: int, timeout: float = 10.0) -> dict:
    """Wait until ``n`` sessions are open: the engine's loop expires sessions on every turn, idle ones too
    (bounded; the clock is a FakeClock already past the TTL). Returns the pool stats."""
    deadline = time.monotonic() + timeout
    while (st := wait_idle(e))["num_sessions"] != n:
        assert time.monotonic() < deadline, f"{st['num_sessions']} sessions still open, not {n}: {st}"
        time.sleep(0.01)
    return st


def other_traffic(e, seed: int) -> None:
    for i in range(3):
        e.generate(input_ids=ids(seed * 100 + i, 200), sampling_params=G)


def agent(e, seed: int, session: str | None, append: bool = False) -> tuple[dict, dict, list[int]]:
    prompt = ids(seed, 104)
    a1 = e.generate(input_ids=prompt, sampling_params=G, session_id=session)
    h1 = prompt + a1["output_ids"]
    other_traffic(e, seed)  # the tool runs; other tenants fill the pool
    tool = ids(seed + 1, 12)
    if append:  # SGLang's session_params: send only the new tokens
        a2 = e.generate(input_ids=tool, sampling_params=G, session_params={"id": session})
    else:
        a2 = e.generate(input_ids=h1 + tool, sampling_params=G, session_id=session)
    return a1, a2, h1


def test_session_keeps_history_under_pressure(small):
    e = small
    e.flush_cache()
    _, miss, h1 = agent(e, 1, None)
    assert len(h1) == 112
    assert miss["meta_info"]["cached_tokens"] == 0  # evicted while the tool ran
    e.flush_cache()
    sid = e.open_session(capacity_of_str_len=4096)
    _, hit, h1b = agent(e, 1, sid)
    # every page of the first call's sequence but the last token's: (112 - 1) // 16 * 16 = 96
    assert hit["meta_info"]["cached_tokens"] == (len(h1b) - 1) // P * P == 96
    assert hit["output_ids"] == miss["output_ids"]  # same tokens, 96 fewer prefilled
    st = wait_idle(e)
    # the pin now covers the second call's sequence: 112 + 12 + 8 = 132 tokens -> 131 // 16 = 8 pages
    assert st["pinned_tokens"] == 128 and st["protected_pages"] == 8
    assert e.close_session(sid) is True
    assert e.close_session(sid) is False
    st = wait_idle(e)
    assert st["protected_pages"] == 0 and st["pinned_tokens"] == 0


def test_session_params_append_history(small):
    """SGLang's form: the second call sends only the tool's tokens; the session supplies the history."""
    e = small
    e.flush_cache()
    sid = e.open_session()
    a1, a2, h1 = agent(e, 1, sid, append=True)
    assert a2["meta_info"]["prompt_tokens"] == len(h1) + 12
    assert a2["meta_info"]["cached_tokens"] == 96
    full = e.generate(input_ids=h1 + ids(2, 12), sampling_params=G)
    assert a2["output_ids"] == full["output_ids"]
    # offset cuts the history; drop_previous_output keeps only the first call's prompt
    a3 = e.generate(
        input_ids=[7, 8, 9],
        sampling_params=G,
        session_params={"id": sid, "rid": a1["meta_info"]["id"], "drop_previous_output": True},
    )
    assert a3["meta_info"]["prompt_tokens"] == 104 + 3
    a4 = e.generate(input_ids=[7], sampling_params=G, session_params={"id": sid, "offset": 10})
    assert a4["meta_info"]["prompt_tokens"] == 11
    with pytest.raises(ValueError, match="session_params: no open session 'nope'"):
        e.generate(input_ids=[7], sampling_params=G, session_params={"id": "nope"})
    with pytest.raises(ValueError, match="session_params.offset 999 is beyond"):
        e.generate(input_ids=[7], sampling_params=G, session_params={"id": sid, "offset": 999})
    with pytest.raises(ValueError, match="one prompt per call"):
        e.generate(input_ids=[[7], [8]], sampling_params=G, session_params={"id": sid})
    with pytest.raises(ValueError, match="session_params.rid: no finished request 'r-nope'"):
        e.generate(input_ids=[7], sampling_params=G, session_params={"id": sid, "rid": "r-nope"})
    with pytest.raises(ValueError, match="session_params.offset"):
        e.generate(input_ids=[7], sampling_params=G, session_params={"id": sid, "offset": "x"})
    with pytest.raises(ValueError, match="already open"):
        e.open_session(session_id=sid)
    e.close_session(sid)


def test_memory_pressure_unpins_oldest_first(small):
    """Two sessions pin 12 pages; a 400-token request needs 26 of the 32: the oldest pin goes, its pages
    become evictable and are evicted, the newer session keeps its pin, and nothing waits forever."""
    e = small
    e.flush_cache()
    s1, s2 = e.open_session(), e.open_session()
    e.generate(input_ids=ids(11, 104), sampling_params=G, session_id=s1)
    e.generate(input_ids=ids(12, 104), sampling_params=G, session_id=s2)
    st = wait_idle(e)
    assert st["pinned_tokens"] == 2 * 96 and st["pinned_sessions"] == 2 and st["protected_pages"] == 12
    out = e.generate(input_ids=ids(13, 400), sampling_params=G)
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    st = wait_idle(e)
    assert st["pinned_sessions"] == 1 and st["pinned_tokens"] == 96  # s1 (older) lost its pin, s2 kept it
    assert st["num_sessions"] == 2
    # s2's history still hits; s1's was evicted
    assert e.generate(input_ids=ids(12, 104) + [5], sampling_params=G)["meta_info"]["cached_tokens"] == 96
    e.close_session(s1)
    e.close_session(s2)


def test_max_pinned_tokens_and_ttl():
    e = make_engine(max_total_tokens=32 * P, page_size=P, max_pinned_tokens=100)
    try:
        with fake_clock(e) as clock:
            s1 = e.open_session()
            s2 = e.open_session(timeout=0.5)  # idle time counts from the end of its last request
            e.generate(input_ids=ids(21, 104), sampling_params=G, session_id=s1)
            assert wait_idle(e)["pinned_tokens"] == 96
            clock.advance(0.4)
            assert expired_now(e) == 0
            clock.advance(0.2)  # s2 has had no request yet: idle 0.6 s, it expires
            assert sessions_left(e, 1)["num_sessions"] == 1
            s2 = e.open_session(timeout=0.5)
            clock.advance(0.4)
            e.generate(input_ids=ids(22, 104), sampling_params=G, session_id=s2)
            st = wait_idle(e)
            assert st["pinned_tokens"] == 96 and st["pinned_sessions"] == 1  # the cap made s1 give way
            clock.advance(0.4)
            assert expired_now(e) == 0  # 0.8 s since it opened, 0.4 s since its request ended
            clock.advance(0.2)
            st = sessions_left(e, 1)
            assert st["num_sessions"] == 1 and st["pinned_tokens"] == 0  # s2 expired
            e.close_session(s1)
    finally:
        close_engine(e)


def test_reopened_id_never_sees_a_closed_sessions_request(small):
    """A request still running when its session closes must not touch a new session opened under the same
    id: not its history (another user's prompt), not its pin, not its in-flight count (the TTL must run)."""
    e = small
    e.flush_cache()
    with fake_clock(e) as clock:
        e.open_session(session_id="zz")
        stream = e.generate(
            input_ids=ids(31, 40), sampling_params={**G, "max_new_tokens": 16}, stream=True, session_params={"id": "zz"}
        )
        next(stream)  # running
        assert e.close_session("zz") is True
        e.open_session(session_id="zz", timeout=3)
        assert len(list(stream)[-1]["output_ids"]) == 16
        new = e.generate(input_ids=ids(32, 5), sampling_params=G, session_params={"id": "zz"})
        assert new["meta_info"]["prompt_tokens"] == 5  # not 40 + 16 + 5
        st = wait_idle(e)
        assert (st["num_sessions"], st["pinned_tokens"], st["pinned_sessions"]) == (1, 0, 0)  # 12 tokens: no page
        clock.advance(3.5)
        assert sessions_left(e, 0)["num_sessions"] == 0  # the TTL ran: its in-flight count is 0
