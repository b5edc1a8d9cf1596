"""``HiCache.stats``: per tier, the hit tokens and rate, the pages and bytes held, the load/store time and the
copies in flight, read from the public counters of ``HiCache`` and of its tiers and copy threads.

Its own file because the report is one idea apart from how the tiers move pages; it reads the cache and
imports nothing of it (``hicache`` imports this), so it is a leaf. ``check_tiers`` (tests) reads it the same way.
"""

from __future__ import annotations

from radixrt.runtime.mem.page_hash import page_hashes


def check_tiers(hc, nodes: list[tuple[list[int], str | None, int]]) -> None:
    """Tier 2's slots are each free, held once or being copied; no page of the tree's ``nodes`` (each
    ``(key from the root, salt, pages)``) or of a copy in flight is also held in tier 2. O(tree tokens);
    tests only. Raises AssertionError."""
    hc.host.check()
    for key, salt, n in nodes:
        for h in page_hashes(key, hc.ps)[-n:] if n else ():
            assert (salt, h) not in hc.host, f"a page of {key[-8:]}... is in the pool and in tier 2"
    for k in hc.restorer.in_flight if hc.restorer is not None else ():  # being copied: in neither
        assert k not in hc.host, f"page {k} is being restored and still held in tier 2"
    for k in hc.storer.in_flight if hc.storer is not None else ():  # matchable only once landed
        assert k not in hc.host, f"page {k} is being stored and already held in tier 2"


def tier_stats(hc, query_tokens: int) -> dict:
    """Per tier: hit tokens and rate (over ``query_tokens``), pages and bytes held, load/store time."""
    pb, q = hc.codec.page_bytes, max(query_tokens, 1)
    out = {
        "write_policy": hc.write_policy,
        "page_bytes": pb,
        "host": {
            "capacity_pages": hc.host.num_slots,
            "used_pages": hc.host.num_used,
            "capacity_bytes": hc.host.num_slots * pb,
            "used_bytes": hc.host.num_used * pb,
            "hit_tokens": hc.host_hit_tokens,
            "hit_rate": hc.host_hit_tokens / q,
            "stored_pages": hc.stored_pages,
            "evicted_pages": hc.host_evicted_pages,
            "loaded_pages": hc.loaded_pages,
            "store_seconds": hc.store_seconds,
            "load_seconds": hc.load_seconds,
            "restoring_jobs": len(hc.restorer.jobs) if hc.restorer else 0,
            "restoring_pages": hc.restorer.pages if hc.restorer else 0,
            "storing_jobs": len(hc.storer.jobs) if hc.storer else 0,
            "storing_pages": hc.storer.pages if hc.storer else 0,
        },
    }
    d = hc.disk
    if d is not None:
        out["disk"] = {
            "dir": d.dir,
            "files": len(d.known),
            "hit_tokens": hc.disk_hit_tokens,
            "hit_rate": hc.disk_hit_tokens / q,
            "written_pages": d.written,
            "read_pages": d.read_pages,
            "dropped_pages": d.dropped,
            "pending_writes": d.pending_writes,
            "bytes_written": d.bytes_written,
            "bytes_read": d.bytes_read,
            "write_seconds": d.write_seconds,
            "read_seconds": d.read_seconds,
            "prefetched_pages": hc.prefetched_pages,
            "dir_recreated": d.recreated,
            "max_files": d.max_files,
            "evicted_files": d.evicted_files,
        }
    return out
