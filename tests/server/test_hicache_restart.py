"""Issue 30: the cache survives a restart of ``radixrt serve``. A 600-token prompt is served once with
``--hicache-storage file:DIR``; the server stops; a new server with the same model and directory serves it
again from the files: ``cached_tokens`` is the prompt's cacheable length cut to pages, and the greedy tokens
are the first server's. Its tiers show in /get_server_info and /metrics."""

from __future__ import annotations

import os
import re
import time

from server_util import start_server

P, N = 16, 600
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def _serve(kv_dir: str, *extra: str):
    return start_server(
        "--quantization",
        "auto",
        "--kv-cache-dtype",
        "fp32",
        "--context-length",
        "1024",
        "--max-total-tokens",
        "2048",
        "--hicache-storage",
        f"file:{kv_dir}",
        "--enable-metrics",
        *extra,
    )


def _gen(s, ids) -> dict:
    with s.client() as c:
        r = c.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY})
        assert r.status_code == 200, r.text
        return r.json()


def _disk(s) -> dict:
    with s.client() as c:
        return c.get("/get_server_info").json()["cache"]["hicache"]["disk"]


def test_restart_serves_a_known_prefix_from_disk(tmp_path, passage_ids):
    ids, kv = passage_ids[:N], str(tmp_path / "kv")
    s = _serve(kv)
    try:
        first = _gen(s, ids)
        assert first["meta_info"]["cached_tokens"] == 0
        deadline = time.time() + 60
        while _disk(s)["pending_writes"] or _disk(s)["files"] < (N - 1) // P:
            assert time.time() < deadline, _disk(s)
            time.sleep(0.05)
        s.wait_idle()
    finally:
        s.stop()
    s = _serve(kv)
    try:
        assert _disk(s)["files"] >= (N - 1) // P  # the new server sees the files before any request
        again = _gen(s, ids)
        assert again["meta_info"]["cached_tokens"] == (N - 1) // P * P == 592
        assert again["output_ids"] == first["output_ids"]
        disk = _disk(s)
        assert disk["hit_tokens"] == 592 and disk["read_pages"] == 37 and disk["dropped_pages"] == 0
        with s.client() as c:
            text = c.get("/metrics").text
        hit = re.search(r'radixrt:hicache_hit_tokens_total\{model_name="[^"]+",tier="disk"\} (\S+)', text)
        assert hit is not None and float(hit.group(1)) == 592.0, text[-3000:]
        restoring = re.search(r'radixrt:hicache_restoring_pages\{model_name="[^"]+"\} (\S+)', text)
        assert restoring is not None and float(restoring.group(1)) == 0.0, text[-3000:]  # the restore landed
        storing = re.search(r'radixrt:hicache_storing_pages\{model_name="[^"]+"\} (\S+)', text)
        assert storing is not None and float(storing.group(1)) == 0.0, text[-3000:]  # nothing evicted yet
        s.wait_idle()
    finally:
        s.stop()


def test_write_back_pages_reach_disk_at_sigterm(tmp_path, passage_ids):
    """Under write_back nothing is written while the prompt's pages stay in the pool; SIGTERM writes them
    (the 37 whole pages of prompt and output computed), and the restarted server hits them."""
    ids, kv = passage_ids[:N], str(tmp_path / "kv")
    s = _serve(kv, "--hicache-write-policy", "write_back")
    try:
        first = _gen(s, ids)
        info = s.client().get("/get_server_info").json()
        assert info["enable_hierarchical_cache"] is True  # turned on by --hicache-storage alone
        s.wait_idle()
        assert _disk(s)["files"] == 0 and _disk(s)["written_pages"] == 0
    finally:
        assert s.stop() == 0
    assert len([f for f in os.listdir(kv) if f.endswith(".kv")]) == (N + 8 - 1) // P == 37
    s = _serve(kv, "--hicache-write-policy", "write_back")
    try:
        again = _gen(s, ids)
        assert again["meta_info"]["cached_tokens"] == 592 and again["output_ids"] == first["output_ids"]
        assert _disk(s)["hit_tokens"] == 592
        s.wait_idle()
    finally:
        s.stop()
