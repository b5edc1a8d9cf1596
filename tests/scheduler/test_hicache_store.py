"""Issue 30: stores to tier 2 run on a copy thread (mem/store_async.py): the pages an admission's allocation
evicts are held (neither free nor evictable) until their copy lands, while the scheduler keeps stepping. A
copy held open by the test stands for a long store: the pool accounting holds with it in flight, a running
request decodes to its end meanwhile, a match for the same prefix waits for it, and an abort or a shutdown
with it pending loses nothing. Greedy tokens are the recomputed ones (fp32 KV pool, the default GGUF's Q4_1
blocks). The conftest checks the pool and tier accounting after every test.
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest import close_engine, make_engine

G = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
ONE = {**G, "max_new_tokens": 1}
KW = {"quantization": "auto", "kv_cache_dtype": "fp32", "max_total_tokens": 256}  # a 16-page pool


@pytest.fixture(scope="module")
def eng():
    e = make_engine(enable_hierarchical_cache=True, hicache_ratio=4.0, **KW)
    yield e
    close_engine(e)


@pytest.fixture(scope="module")
def cold():
    e = make_engine(disable_radix_cache=True, **KW)
    yield e
    close_engine(e)


def cache(e) -> dict:
    return e.get_server_info()["cache"]


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


class Gate:
    """Holds the store thread's copies (``Storer._copy``) until ``open``; counts the copies entered."""

    def __init__(self, e) -> None:
        self.storer = e.scheduler.req_pages.hicache.storer
        self.real, self.entered, self.opened = self.storer._copy, [], threading.Event()
        self.storer._copy = self._copy

    def _copy(self, job) -> None:
        self.entered.append(len(job.keys))
        assert self.opened.wait(30), "the gate was never opened"
        self.real(job)

    def open(self) -> None:
        self.opened.set()

    def remove(self) -> None:
        self.opened.set()
        del self.storer._copy


@pytest.fixture
def gate(eng):
    g = Gate(eng)
    yield g
    g.remove()


def submit(e, ids, params, rid, got: dict) -> threading.Thread:
    t = threading.Thread(target=lambda: got.update({rid: e.generate(input_ids=ids, sampling_params=params, rid=rid)}))
    t.start()
    return t


def cache_a(e, a) -> None:
    """The pool holds only ``a``'s 6 whole pages (the 100-token prompt, one token out)."""
    assert e.flush_cache() is True
    e.generate(input_ids=a, sampling_params=ONE)
    c = cache(e)
    assert (c["evictable_pages"], c["free_pages"], c["hicache"]["host"]["used_pages"]) == (6, 10, 0)


def test_stored_pages_restore_exact_and_the_step_never_copied(eng, cold, passage_ids, gate):
    a, b = passage_ids[:100], passage_ids[200:400]
    refs = [cold.generate(input_ids=p, sampling_params=q)["output_ids"] for p, q in ((a, G), (b, ONE))]
    cache_a(eng, a)
    gate.open()
    before = cache(eng)["hicache"]["host"]
    out_b = eng.generate(input_ids=b, sampling_params=ONE)  # 13 pages: a's 3 tail pages go to tier 2
    assert gate.entered == [3]  # on the store thread, in one job
    out_a = eng.generate(input_ids=a, sampling_params=G)
    after = cache(eng)["hicache"]["host"]
    assert [out_a["output_ids"], out_b["output_ids"]] == refs
    assert out_a["meta_info"]["cached_tokens"] == 96
    assert after["hit_tokens"] - before["hit_tokens"] == 48
    assert after["stored_pages"] - before["stored_pages"] == 3 + 2 + 2  # b evicts 3, a restore 2, a decode 2


def test_pool_invariant_holds_with_a_store_in_flight(eng, passage_ids, gate):
    a, b = passage_ids[:100], passage_ids[200:400]
    cache_a(eng, a)
    got: dict = {}
    t = submit(eng, b, ONE, "b", got)
    try:
        wait_for(lambda: gate.entered == [3])
        st = eng.check_invariants()  # free + evictable + protected + private == total, tiers consistent
        assert (st["free_pages"], st["evictable_pages"], st["protected_pages"]) == (10, 3, 0)
        assert (st["private_pages"], st["storing_pages"]) == (3, 3)  # held: neither free nor evictable
        h = st["hicache"]["host"]
        assert (h["storing_jobs"], h["storing_pages"], h["used_pages"]) == (1, 3, 0)  # not matchable yet
        assert eng.get_server_info()["num_waiting"] == 1  # b waits for the pages, it is not refused
    finally:
        gate.open()
        t.join(30)
    assert got["b"]["meta_info"]["finish_reason"]["type"] == "length"
    st = eng.check_invariants()
    assert st["storing_pages"] == 0 and st["hicache"]["host"]["used_pages"] >= 3


def test_running_request_decodes_while_a_store_is_held(eng, cold, passage_ids):
    a, r1, r2 = passage_ids[:100], passage_ids[500:540], passage_ids[600:740]
    g8 = {**G, "max_new_tokens": 8}  # r1 keeps its 3 pages (40 + 7 tokens computed): no page to allocate
    refs = [cold.generate(input_ids=p, sampling_params=q)["output_ids"] for p, q in ((r1, g8), (r2, G))]
    cache_a(eng, a)
    s, seen, got = eng.scheduler, {}, {}
    g = Gate(eng)
    real_copy = g._copy

    def hold_until_r1_done(job):  # the store's copy waits for r1's last token
        if seen:
            return real_copy(job)
        steps0, deadline = s.stats.steps, time.time() + 30
        while "r1" in s.by_rid and time.time() < deadline:
            time.sleep(0.002)
        seen.update(
            r1_done="r1" not in s.by_rid,
            steps=s.stats.steps - steps0,
            pages=len(job.keys),
            waiting=[r.rid for r in list(s.waiting)],
            r2_out=len(s.by_rid["r2"].output_ids),
        )
        g.open()
        real_copy(job)

    g.storer._copy = hold_until_r1_done
    try:
        t1 = submit(eng, r1, g8, "r1", got)
        wait_for(lambda: "r1" in s.by_rid and s.by_rid["r1"] in s.running)
        t2 = submit(eng, r2, G, "r2", got)  # 9 pages, 7 free: 2 of a's go down a tier, held by the copy
        t1.join(60)
        t2.join(60)
    finally:
        g.remove()
    assert seen["r1_done"] is True and seen["pages"] == 2  # all of r1's tokens came while the copy was held
    assert seen["steps"] >= 5 and seen["waiting"] == ["r2"] and seen["r2_out"] == 0
    assert [got["r1"]["output_ids"], got["r2"]["output_ids"]] == refs
    assert [got[r]["meta_info"]["cached_tokens"] for r in ("r1", "r2")] == [0, 0]


def test_match_for_a_prefix_being_stored_waits_for_the_copy(eng, cold, passage_ids, gate):
    a, b = passage_ids[:100], passage_ids[200:400]
    ref_a = cold.generate(input_ids=a, sampling_params=G)["output_ids"]
    cache_a(eng, a)
    got: dict = {}
    tb, ta = submit(eng, b, ONE, "b", got), None
    try:
        wait_for(lambda: gate.entered == [3])
        before = cache(eng)["hicache"]["host"]
        ta = submit(eng, a, G, "a", got)  # lpm: a (3 pages in the tree) goes before b
        s = eng.scheduler
        wait_for(lambda: "a" in s.by_rid and s.by_rid["a"].restore_job is not None)
        assert s.by_rid["a"].restore_job.is_store  # it waits for the store; the half-written slots stay unseen
        h = cache(eng)["hicache"]["host"]
        assert (h["storing_pages"], h["restoring_jobs"], h["used_pages"]) == (3, 0, 0)
        assert sorted(r.rid for r in s.waiting) == ["a", "b"]
    finally:
        gate.open()
        tb.join(30)
        if ta is not None:
            ta.join(30)
    after = cache(eng)["hicache"]["host"]
    assert got["a"]["output_ids"] == ref_a
    assert got["a"]["meta_info"]["cached_tokens"] == 96  # 48 in the pool + 48 restored once the copy landed
    assert after["hit_tokens"] - before["hit_tokens"] == 48


def test_abort_with_a_store_pending_loses_nothing(eng, cold, passage_ids, gate):
    a, b = passage_ids[:100], passage_ids[200:400]
    ref_a = cold.generate(input_ids=a, sampling_params=G)["output_ids"]
    cache_a(eng, a)
    got: dict = {}
    t = submit(eng, b, G, "victim", got)
    try:
        wait_for(lambda: gate.entered == [3])
        eng.abort("victim")
        t.join(30)
        assert got["victim"]["meta_info"]["finish_reason"]["type"] == "abort"
        assert got["victim"]["output_ids"] == []
        assert cache(eng)["storing_pages"] == 3  # the copy is still held; its pages with it
    finally:
        gate.open()
        t.join(30)
    wait_for(lambda: cache(eng)["storing_pages"] == 0)
    st = eng.check_invariants()
    assert (st["free_pages"], st["evictable_pages"], st["private_pages"]) == (13, 3, 0)
    assert st["hicache"]["host"]["used_pages"] == 3
    again = eng.generate(input_ids=a, sampling_params=G)
    assert again["meta_info"]["cached_tokens"] == 96 and again["output_ids"] == ref_a


def test_shutdown_with_a_store_pending_persists_it(tmp_path, cold, passage_ids):
    """write_back: a shutdown lands the held copy, then writes tiers 1-2 to files; a restart hits them all."""
    a, b = passage_ids[:100], passage_ids[200:400]
    ref_a = cold.generate(input_ids=a, sampling_params=G)["output_ids"]
    kw = dict(
        enable_hierarchical_cache=True,
        hicache_ratio=4.0,
        hicache_storage=f"file:{tmp_path / 'kv'}",
        hicache_write_policy="write_back",
        **KW,
    )
    e = make_engine(**kw)
    try:
        cache_a(e, a)
        g, got = Gate(e), {}
        t = submit(e, b, ONE, "b", got)
        wait_for(lambda: g.entered == [3])
        e.abort("b")
        t.join(30)
        assert cache(e)["storing_pages"] == 3
        threading.Timer(0.3, g.open).start()  # the copy finishes while shutdown waits for it
    finally:
        close_engine(e)
    assert e.scheduler.req_pages.hicache.storer.jobs == [] and e.scheduler.req_pages.allocator.num_free == 13
    e = make_engine(**kw)
    try:
        out = e.generate(input_ids=a, sampling_params=G)
        assert out["meta_info"]["cached_tokens"] == 96 and out["output_ids"] == ref_a
        assert cache(e)["hicache"]["disk"]["hit_tokens"] == 96
    finally:
        close_engine(e)
