"""Issue 30: restores run on a copy thread (mem/restore_async.py) while the scheduler keeps stepping. A file read
held open by the test stands for a long restore: another request decodes to the end meanwhile, an abort
leaves no page or lock behind, and two requests on one prefix share one restore. Greedy tokens are the
recomputed ones (fp32 KV pool, the default GGUF's Q4_1 blocks); the bad-file cases of test_hicache.py run
through the same copy thread. The conftest checks the pool and tier accounting after every test.
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest import close_engine, make_engine

P = 16
G = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
KW = {"quantization": "auto", "kv_cache_dtype": "fp32", "max_total_tokens": 256}


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    kv = tmp_path_factory.mktemp("hicache_async") / "kv"
    e = make_engine(enable_hierarchical_cache=True, hicache_ratio=4.0, hicache_storage=f"file:{kv}", **KW)
    yield e
    close_engine(e)


@pytest.fixture(scope="module")
def cold():
    e = make_engine(disable_radix_cache=True, **KW)
    yield e
    close_engine(e)


def tiers(e) -> dict:
    return e.get_server_info()["cache"]["hicache"]


def on_disk_only(e, ids) -> None:
    """Cache ``ids``, wait for its files, then empty the pool and tier 2: a match must read the files."""
    e.generate(input_ids=ids, sampling_params={**G, "max_new_tokens": 1})
    assert e.scheduler.req_pages.hicache.disk.flush()
    assert e.flush_cache() is True
    assert tiers(e)["host"]["used_pages"] == 0


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def gated_reads(eng):
    """Replace the disk tier's ``read`` with ``gate(salt, hash)`` then the real read; restored afterwards."""
    disk = eng.scheduler.req_pages.hicache.disk
    real = disk.read

    def install(gate):
        def read(salt, h):
            gate(salt, h)
            return real(salt, h)

        disk.read = read

    yield install
    del disk.read


def test_running_request_decodes_while_a_restore_waits(eng, cold, passage_ids, gated_reads):
    a, r1 = passage_ids[:100], passage_ids[500:540]
    refs = [cold.generate(input_ids=p, sampling_params=G)["output_ids"] for p in (r1, a)]
    on_disk_only(eng, a)
    seen: dict = {}
    s = eng.scheduler

    def hold_until_r1_done(salt, h):  # the restore's first read waits for r1's last token
        if seen:
            return
        steps0, acc0, deadline = s.stats.steps, s.spec.counts.accepted_tokens, time.time() + 30
        while "r1" in s.by_rid and time.time() < deadline:
            time.sleep(0.002)
        seen.update(
            r1_done="r1" not in s.by_rid,
            steps=s.stats.steps - steps0,
            accepted=s.spec.counts.accepted_tokens - acc0,
            r2_waiting=[r.rid for r in list(s.waiting)],
            r2_out=len(s.by_rid["r2"].output_ids),
        )

    gated_reads(hold_until_r1_done)
    before = tiers(eng)["disk"]
    outs = eng.generate(input_ids=[r1, a], sampling_params=G, rid=["r1", "r2"])
    assert seen["r1_done"] is True  # all 24 of r1's tokens came while r2's pages were being read
    # one token per step, plus the drafts verified and kept (speculation) in the same steps
    assert seen["steps"] + seen["accepted"] >= 23 and seen["r2_waiting"] == ["r2"] and seen["r2_out"] == 0
    assert [o["output_ids"] for o in outs] == refs
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 96]
    after = tiers(eng)
    assert after["disk"]["read_pages"] - before["read_pages"] == 6
    assert after["disk"]["hit_tokens"] - before["hit_tokens"] == 96
    assert after["host"]["restoring_jobs"] == 0 and after["host"]["restoring_pages"] == 0


def test_abort_during_restore_frees_every_page(eng, cold, passage_ids, gated_reads):
    a = passage_ids[150:250]
    ref = cold.generate(input_ids=a, sampling_params=G)["output_ids"]
    on_disk_only(eng, a)
    gate = threading.Event()
    gated_reads(lambda salt, h: gate.wait(30))
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(out=eng.generate(input_ids=a, sampling_params=G, rid="victim")))
    t.start()
    try:
        wait_for(lambda: tiers(eng)["host"]["restoring_jobs"] == 1)
        assert tiers(eng)["host"]["restoring_pages"] == 6
        assert eng.get_server_info()["cache"]["private_pages"] == 6  # the job's pages: neither free nor in the tree
        eng.abort("victim")
        t.join(30)
        assert got["out"]["meta_info"]["finish_reason"]["type"] == "abort"
        assert got["out"]["output_ids"] == []
        assert tiers(eng)["host"]["restoring_jobs"] == 1  # the read is still held
    finally:
        gate.set()
        t.join(30)
    wait_for(lambda: tiers(eng)["host"]["restoring_jobs"] == 0)
    st = eng.check_invariants()
    assert st["private_pages"] == 0 and st["protected_pages"] == 0
    assert st["free_pages"] + st["evictable_pages"] == st["total_pages"]
    # the aborted request's pages landed in the tree (their KV is valid): the next request hits them
    again = eng.generate(input_ids=a, sampling_params=G)
    assert again["meta_info"]["cached_tokens"] == 96 and again["output_ids"] == ref


def test_two_requests_share_one_restore(eng, cold, passage_ids):
    a = passage_ids[300:400]
    x, y = a + passage_ids[600:620], a + passage_ids[650:670]
    refs = [cold.generate(input_ids=p, sampling_params=G)["output_ids"] for p in (x, y)]
    on_disk_only(eng, a)
    before = tiers(eng)["disk"]
    outs = eng.generate(input_ids=[x, y], sampling_params=G)
    assert [o["output_ids"] for o in outs] == refs
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [96, 96]
    after = tiers(eng)["disk"]
    assert after["read_pages"] - before["read_pages"] == 6  # one read of each file, not two
    assert after["hit_tokens"] - before["hit_tokens"] == 96


def test_pages_a_restore_evicts_come_back_exact(eng, cold, passage_ids):
    """A restore into a full pool evicts other pages; their bytes leave on the copy thread before the restored
    ones overwrite them, and restored in turn they give the recomputed tokens."""
    a, f1, f2 = passage_ids[410:510], passage_ids[5:145], passage_ids[15:155]
    refs = [cold.generate(input_ids=p, sampling_params=G)["output_ids"] for p in (a, f1)]
    assert eng.flush_cache() is True
    for p in (a, f1, f2):  # a goes down to tier 2 as f1 and f2 fill the 16-page pool
        eng.generate(input_ids=p, sampling_params=G)
    before = tiers(eng)["host"]
    out = eng.generate(input_ids=a, sampling_params=G)  # its allocation evicts f1's pages
    mid = tiers(eng)["host"]
    assert out["meta_info"]["cached_tokens"] == 96 and out["output_ids"] == refs[0]
    again = eng.generate(input_ids=f1, sampling_params=G)
    after = tiers(eng)["host"]
    assert mid["hit_tokens"] - before["hit_tokens"] == 96
    assert mid["stored_pages"] - before["stored_pages"] == 7  # 6 for the restore's allocation, 1 for a's extend
    assert again["meta_info"]["cached_tokens"] == 128  # f1's 8 whole pages, all from tier 2
    assert after["hit_tokens"] - mid["hit_tokens"] == 128
    assert again["output_ids"] == refs[1]
