"""Issue 30, the tiers' parts without a model: pages as rows of bytes (every KV dtype), tier 2's eviction
order and accounting, tier 3's file checks."""

from __future__ import annotations

import os

import pytest
import torch

from radixrt.runtime.mem.disk_tier import HEADER, DiskTier
from radixrt.runtime.mem.host_tier import HostTier
from radixrt.runtime.mem.kv_pool import KV_DTYPES, KVPool
from radixrt.runtime.mem.page_codec import PageCodec


@pytest.mark.parametrize("dtype", list(KV_DTYPES))
def test_codec_round_trip_is_bitwise(dtype):
    pool = KVPool(6, 4, 2, 3, 8, KV_DTYPES[dtype])
    g = torch.Generator().manual_seed(0)
    for t in pool.k + pool.v + (pool.k_scales or []) + (pool.v_scales or []):
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8, generator=g))
    codec = PageCodec(pool)
    per_token = KVPool.bytes_per_token(2, 3, 8, KV_DTYPES[dtype])
    assert codec.page_bytes == 4 * per_token
    rows = codec.pack([1, 4])
    assert rows.shape == (2, codec.page_bytes) and rows.dtype == torch.uint8
    before = [t[[1, 4]].clone() for t in codec.tensors]
    codec.unpack([0, 5], rows)
    for t, b in zip(codec.tensors, before):
        assert torch.equal(t[[0, 5]].view(torch.uint8), b.view(torch.uint8))
    with pytest.raises(ValueError, match="rows must be uint8"):
        codec.unpack([0], rows)


def test_host_tier_evicts_lowest_score_first():
    host = HostTier(3, 2)
    rows = torch.arange(8, dtype=torch.uint8).view(4, 2)
    assert host.store([(None, 1), (None, 2)], [(5.0,), (3.0,)], rows[:2]) == []
    spilled = host.store([(None, 3), (None, 4)], [(4.0,), (6.0,)], rows[2:])
    assert [k for k, _ in spilled] == [(None, 2)] and torch.equal(spilled[0][1], rows[1])
    assert host.num_used == 3 and (None, 2) not in host
    slot, score, hits = host.take((None, 1))
    assert score == (5.0,) and hits == 0 and torch.equal(host.rows[slot], rows[0]) and (None, 1) not in host
    host.put_back((None, 1), slot, score)
    host.check()
    assert host.discard([(None, 1), (None, 9)]) == 1
    host.check()
    assert host.num_free == 1 and host.clear() == 2 and host.num_free == 3
    host.check()


def test_disk_tier_checks_every_field(tmp_path):
    fp = bytes(range(16))
    shape, pb = ("fp16", 16, 2, 3, 8), 100
    d = DiskTier(str(tmp_path / "kv"), fp, shape, pb)
    row = bytes(range(100))
    assert d.write("t", 7, row) and not d.write("t", 7, row)
    assert d.flush()
    assert oct(os.stat(d.dir).st_mode & 0o777) == "0o700"
    name = d.name("t", 7)
    assert oct(os.stat(d.path(name)).st_mode & 0o777) == "0o600"
    assert os.path.getsize(d.path(name)) == HEADER.size + pb
    assert d.read("t", 7) == row
    assert d.read("u", 7) is None and d.read("t", 8) is None  # other names: no file, nothing dropped
    assert d.dropped == 0
    d.close()
    # a new tier over the same directory finds the file; another fingerprint or layout does not
    d2 = DiskTier(str(tmp_path / "kv"), fp, shape, pb)
    assert ("t", 7) in d2 and d2.read("t", 7) == row
    other = DiskTier(str(tmp_path / "kv"), bytes(16), shape, pb)
    assert ("t", 7) not in other
    # a file moved under another page's name is refused by its header, and deleted
    os.replace(d2.path(name), d2.path(d2.name("t", 9)))
    d2.known.add(d2.name("t", 9))
    assert d2.read("t", 9) is None and d2.dropped == 1
    assert not os.path.exists(d2.path(d2.name("t", 9)))
    with pytest.raises(ValueError, match="16 bytes"):
        DiskTier(str(tmp_path / "kv"), b"x", shape, pb)
    d2.close()
    other.close()


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"hicache_storage": "/tmp/x"}, "hicache_storage"),
        ({"hicache_storage": "file:"}, "hicache_storage"),
        ({"hicache_size": -1.0}, "hicache_size"),
        ({"hicache_ratio": 0.0}, "hicache_ratio"),
        ({"hicache_write_policy": "write_around"}, "hicache_write_policy"),
        ({"hicache_prefetch_threshold": 0}, "hicache_prefetch_threshold"),
        ({"hicache_storage_size": 1e-12}, "hicache_storage_size: 1e-12 GB holds no page"),
        ({"hicache_size": 0.5, "tp": 3}, "enable_hierarchical_cache is not supported with --tp > 1"),
    ],
)
def test_bad_tier_flags_name_the_field(kw, field):
    from radixrt.runtime.config import ServerArgs

    with pytest.raises(ValueError, match=field):
        ServerArgs(**kw)


def test_storage_dir_checked_before_the_model_loads(tmp_path):
    from radixrt.runtime.config import ServerArgs

    afile = tmp_path / "afile"
    afile.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    for d, why in (
        (afile, "exists and is not a directory"),
        (afile / "sub", "cannot be created"),
        ("/proc/radixrt-x", "cannot be created"),
        (dangling, "is a symbolic link to .*gone.*does not exist"),
    ):
        with pytest.raises(ValueError, match=f"hicache_storage: .*{why}"):
            ServerArgs(hicache_storage=f"file:{d}")
    assert ServerArgs(hicache_storage=f"file:{tmp_path / 'new' / 'dir'}").hicache_storage  # made later, 0700


def test_host_tier_evicts_a_nodes_tail_before_its_head():
    host = HostTier(4, 1)
    host.store([(None, i) for i in range(4)], [(1.0,)] * 4, torch.zeros(4, 1, dtype=torch.uint8))
    spilled = host.store([(None, 9)], [(2.0,)], torch.ones(1, 1, dtype=torch.uint8))
    assert [k for k, _ in spilled] == [(None, 3)]


def test_disk_tier_recreates_a_deleted_directory(tmp_path):
    import shutil

    d = DiskTier(str(tmp_path / "kv"), bytes(16), ("fp16", 16, 2, 3, 8), 10)
    assert d.write(None, 1, bytes(10)) and d.flush()
    shutil.rmtree(d.dir)
    assert d.read(None, 1) is None and (None, 1) not in d  # the lost file is forgotten: written again later
    assert d.write(None, 2, bytes(range(10))) and d.write(None, 1, bytes(10)) and d.flush()
    assert d.recreated == 1 and d.written == 3
    assert oct(os.stat(d.dir).st_mode & 0o777) == "0o700"
    assert sorted(os.listdir(d.dir)) == sorted(d.name(None, h) + ".kv" for h in (1, 2))
    assert d.read(None, 2) == bytes(range(10)) and d.dropped == 0
    d.close()


def test_disk_tier_forgets_the_files_of_a_deleted_directory(tmp_path):
    import shutil

    d = DiskTier(str(tmp_path / "kv"), bytes(16), ("fp16", 16, 2, 3, 8), 10)
    assert all(d.write(None, h, bytes(10)) for h in (1, 3, 4)) and d.flush()
    shutil.rmtree(d.dir)
    assert d.write(None, 2, bytes(10)) and d.flush()  # no read of the lost ones: the write finds out
    assert d.recreated == 1 and d.known == {d.name(None, 2)} and list(d._lru) == [d.name(None, 2)]
    assert all((None, h) not in d for h in (1, 3, 4))
    d.close()


def test_server_args_report_the_tiers_on(tmp_path):
    from radixrt.runtime.config import ServerArgs

    assert ServerArgs().enable_hierarchical_cache is False
    assert ServerArgs(hicache_size=0.5).enable_hierarchical_cache is True
    assert ServerArgs(hicache_storage=f"file:{tmp_path / 'kv'}").enable_hierarchical_cache is True


def test_disk_tier_size_bound_evicts_least_recently_used(tmp_path):
    per_file = HEADER.size + 10
    d = DiskTier(str(tmp_path / "kv"), bytes(16), ("fp16", 16, 2, 3, 8), 10, max_bytes=3 * per_file + 5)
    assert d.max_files == 3
    for h in range(4):
        assert d.write(None, h, bytes([h]) * 10)
    assert d.flush() and d.evicted_files == 1 and (None, 0) not in d  # page 0 went, the oldest
    assert d.read(None, 1) == bytes([1]) * 10  # a read makes page 1 the newest: page 2 goes next
    assert d.write(None, 4, bytes([4]) * 10) and d.flush()
    files = sorted(os.listdir(d.dir))
    assert files == sorted(d.name(None, h) + ".kv" for h in (1, 3, 4)) and d.evicted_files == 2
    d.close()
    again = DiskTier(d.dir, bytes(16), ("fp16", 16, 2, 3, 8), 10, max_bytes=2 * per_file)
    os.utime(again.path(again.name(None, 4)), (1, 1))  # the oldest by mtime at start goes first
    again.close()
    again = DiskTier(d.dir, bytes(16), ("fp16", 16, 2, 3, 8), 10, max_bytes=2 * per_file)
    assert again.write(None, 5, bytes(10)) and again.flush()
    assert len(os.listdir(d.dir)) == 2 and (None, 4) not in again and again.evicted_files == 2
    again.close()
    with pytest.raises(ValueError, match="hicache_storage_size"):
        DiskTier(d.dir, bytes(16), ("fp16", 16, 2, 3, 8), 10, max_bytes=per_file - 1)
