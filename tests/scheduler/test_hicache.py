"""Issue 30: cache tiers under the radix tree. A prefix evicted from a 16-page pool comes back from the host
store (tier 2) or from files (tier 3) with the greedy tokens of a recomputed one (fp32 KV pool, the default
GGUF's own Q4_1 blocks); bad files are dropped and recomputed; salts keep tenants apart. The conftest checks
the pool and tier accounting after every test (``Engine.check_invariants`` -> ``HiCache.check_invariants``).
"""

from __future__ import annotations

import os

import pytest

from conftest import close_engine, make_engine
from radixrt.runtime.mem.disk_tier import HEADER
from radixrt.runtime.mem.page_hash import page_hashes

P = 16
G = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
KW = {"quantization": "auto", "kv_cache_dtype": "fp32", "max_total_tokens": 256}
FP_AT, SALT_AT = 24, 40  # header offsets of the model fingerprint and the salt digest (disk_tier.HEADER)


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hicache") / "kv")


@pytest.fixture(scope="module")
def tiered(kv_dir):
    e = make_engine(enable_hierarchical_cache=True, hicache_ratio=4.0, hicache_storage=f"file:{kv_dir}", **KW)
    yield e
    close_engine(e)


@pytest.fixture(scope="module")
def cold():
    e = make_engine(disable_radix_cache=True, **KW)
    yield e
    close_engine(e)


def tiers(e) -> dict:
    return e.get_server_info()["cache"]["hicache"]


def tree_pages(e, ids, salt=None) -> int:
    return e._call(lambda: len(e.scheduler.tree.match_prefix(ids, salt).pages))


def evict_all(e, passage_ids) -> None:
    """Four 140-token prompts through the 16-page pool push everything older out of it."""
    for i in range(4):
        e.generate(input_ids=passage_ids[7 + 150 * i : 147 + 150 * i], sampling_params=G)


def disk_file(e, ids, page: int, salt=None) -> str:
    d = e.scheduler.req_pages.hicache.disk
    assert d.flush()
    return d.path(d.name(salt, page_hashes(ids, P)[page]))


def test_host_tier_restore_is_exact(tiered, cold, passage_ids):
    # A prompt of its own: the module's other tests leave files for theirs in kv_dir, which flush_cache keeps
    ids = passage_ids[620:720]
    ref = cold.generate(input_ids=ids, sampling_params=G)["output_ids"]
    assert tiered.flush_cache() is True
    first = tiered.generate(input_ids=ids, sampling_params=G)
    assert first["meta_info"]["cached_tokens"] == 0 and first["output_ids"] == ref
    evict_all(tiered, passage_ids)
    assert tree_pages(tiered, ids) == 0
    before = tiers(tiered)
    assert before["host"]["used_pages"] >= 6
    again = tiered.generate(input_ids=ids, sampling_params=G)
    after = tiers(tiered)
    assert again["meta_info"]["cached_tokens"] == 96
    assert again["output_ids"] == ref
    assert after["host"]["hit_tokens"] - before["host"]["hit_tokens"] == 96
    assert after["disk"]["hit_tokens"] == before["disk"]["hit_tokens"]


def test_disk_tier_restore_is_exact(tiered, cold, passage_ids):
    ids = passage_ids[100:230]
    ref = cold.generate(input_ids=ids, sampling_params=G)["output_ids"]
    tiered.generate(input_ids=ids, sampling_params=G)
    assert tiered.scheduler.req_pages.hicache.disk.flush()
    assert tiered.flush_cache() is True  # empties the pool and tier 2; the files stay
    assert tiers(tiered)["host"]["used_pages"] == 0
    before = tiers(tiered)["disk"]
    out = tiered.generate(input_ids=ids, sampling_params=G)
    after = tiers(tiered)["disk"]
    assert out["meta_info"]["cached_tokens"] == 128
    assert out["output_ids"] == ref
    assert after["hit_tokens"] - before["hit_tokens"] == 128
    assert after["read_pages"] - before["read_pages"] == 8


def _corrupt(path):
    data = bytearray(open(path, "rb").read())
    data[HEADER.size + 1000] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def _patch(at: int):
    def patch(path):
        data = bytearray(open(path, "rb").read())
        data[at : at + 8] = bytes(x ^ 0x5A for x in data[at : at + 8])
        open(path, "wb").write(bytes(data))

    return patch


@pytest.mark.parametrize(
    "damage,start",
    [(_corrupt, 200), (_truncate, 330), (_patch(FP_AT), 460), (_patch(SALT_AT), 590)],
    ids=["corrupt", "truncated", "wrong_model", "wrong_salt"],
)
def test_bad_file_is_dropped_and_recomputed(tiered, cold, passage_ids, damage, start):
    ids = passage_ids[start : start + 100]
    ref = cold.generate(input_ids=ids, sampling_params=G)["output_ids"]
    tiered.generate(input_ids=ids, sampling_params=G)
    path = disk_file(tiered, ids, 2)
    assert tiered.flush_cache() is True
    damage(path)
    dropped = tiers(tiered)["disk"]["dropped_pages"]
    out = tiered.generate(input_ids=ids, sampling_params=G)
    assert out["meta_info"]["cached_tokens"] == 2 * P  # pages 0-1 from disk, the rest recomputed
    assert out["output_ids"] == ref
    assert tiers(tiered)["disk"]["dropped_pages"] == dropped + 1
    # the recomputed page was written again under write_through: next time all six pages come back
    assert os.path.getsize(disk_file(tiered, ids, 2)) == HEADER.size + tiers(tiered)["page_bytes"]
    assert tiered.flush_cache() is True
    again = tiered.generate(input_ids=ids, sampling_params=G)
    assert again["meta_info"]["cached_tokens"] == 96 and again["output_ids"] == ref


def test_salts_stay_apart_in_every_tier(tiered, passage_ids):
    ids = passage_ids[40:140]
    tiered.generate(input_ids=ids, sampling_params=G, cache_salt="tenant-a")
    evict_all(tiered, passage_ids)
    assert tree_pages(tiered, ids, "tenant-a") == 0
    other = tiered.generate(input_ids=ids, sampling_params=G, cache_salt="tenant-b")
    assert other["meta_info"]["cached_tokens"] == 0  # tier 2 holds tenant-a's pages only
    assert tiered.flush_cache() is True
    mine = tiered.generate(input_ids=ids, sampling_params=G, cache_salt="tenant-a")
    assert mine["meta_info"]["cached_tokens"] == 96  # from tier 3, under tenant-a's names
    unsalted = tiered.generate(input_ids=ids, sampling_params=G)
    assert unsalted["meta_info"]["cached_tokens"] == 0


def test_another_model_never_reads_the_files(kv_dir, tiered, passage_ids):
    """The same directory under fp32 weights (another fingerprint): no hit, nothing dropped."""
    ids = passage_ids[:100]
    tiered.generate(input_ids=ids, sampling_params=G)
    assert tiered.scheduler.req_pages.hicache.disk.flush()
    e = make_engine(enable_hierarchical_cache=True, hicache_storage=f"file:{kv_dir}", **{**KW, "quantization": "none"})
    try:
        out = e.generate(input_ids=ids, sampling_params=G)
        assert out["meta_info"]["cached_tokens"] == 0
        assert tiers(e)["disk"]["dropped_pages"] == 0 and tiers(e)["disk"]["read_pages"] == 0
        assert oct(os.stat(kv_dir).st_mode & 0o777) == "0o700"
    finally:
        close_engine(e)


def test_write_back_spills_host_to_disk(tmp_path, cold, passage_ids):
    """A 6-page host store under write_back: pages reach the files only as they leave tier 2."""
    kv = tmp_path / "wb"
    e = make_engine(
        hicache_size=6 * 737280 / 2**30, hicache_storage=f"file:{kv}", hicache_write_policy="write_back", **KW
    )
    try:
        ids = passage_ids[:100]
        ref = cold.generate(input_ids=ids, sampling_params=G)["output_ids"]
        e.generate(input_ids=ids, sampling_params=G)
        assert tiers(e)["disk"]["written_pages"] == 0
        evict_all(e, passage_ids)
        st = tiers(e)
        assert st["host"]["capacity_pages"] == 6 and st["host"]["used_pages"] == 6
        assert st["host"]["evicted_pages"] > 0
        assert e.scheduler.req_pages.hicache.disk.flush()
        assert tiers(e)["disk"]["written_pages"] == st["host"]["evicted_pages"]
        assert e.flush_cache() is True
        out = e.generate(input_ids=ids, sampling_params=G)
        assert out["meta_info"]["cached_tokens"] == 96 and out["output_ids"] == ref
    finally:
        close_engine(e)


def test_queued_request_is_prefetched_from_disk(tmp_path, cold, passage_ids):
    """One request runs at a time: while the first decodes, the queued one's six pages are read from their
    files into tier 2, and its admission copies them from there."""
    e = make_engine(
        hicache_storage=f"file:{tmp_path / 'pf'}",
        hicache_prefetch_threshold=32,
        max_running_requests=1,
        schedule_policy="fcfs",
        **KW,
    )
    try:
        a, b = passage_ids[:100], passage_ids[300:400]
        sp = {**G, "max_new_tokens": 24}
        ref = cold.generate(input_ids=a, sampling_params=sp)["output_ids"]
        e.generate(input_ids=a, sampling_params=sp)
        assert e.scheduler.req_pages.hicache.disk.flush()
        assert e.flush_cache() is True
        outs = e.generate(input_ids=[b, a], sampling_params=sp)
        assert outs[0]["meta_info"]["cached_tokens"] == 0
        assert outs[1]["meta_info"]["cached_tokens"] == 96 and outs[1]["output_ids"] == ref
        st = tiers(e)
        assert st["disk"]["prefetched_pages"] == 6
        assert st["host"]["hit_tokens"] == 96 and st["disk"]["hit_tokens"] == 0
    finally:
        close_engine(e)


def test_host_tier_larger_than_memory_is_refused_by_name():
    """A --hicache-size past the memory available: a ValueError naming the flag, not numpy's MemoryError."""
    with pytest.raises(
        ValueError,
        match=r"hicache_size: a host tier of 1048576\.00 GB is more than the .* GB of "
        r"memory available",
    ):
        make_engine(hicache_size=2.0**20, **KW)
