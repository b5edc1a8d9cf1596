"""The disk tier after a crash. A server with ``--hicache-storage file:DIR`` is killed with SIGKILL while it
writes a prompt's pages; files in DIR are then corrupted and truncated, and a write the crash cut short is
left behind. The restarted server logs and deletes every bad file and the stale temporary one before it
reads any (its start-up scrub, ``mem/disk_tier.py``), and its greedy tokens equal those computed without a
cache (the same prompts under a ``cache_salt`` no file has)."""

from __future__ import annotations

import os
import threading
import time

import httpx

from server_util import start_server

P = 16
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def _serve(kv_dir: str):
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
    )


def _gen(s, ids, salt: str | None = None) -> dict:
    with s.client() as c:
        r = c.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()


def _disk(s) -> dict:
    with s.client() as c:
        return c.get("/get_server_info").json()["cache"]["hicache"]["disk"]


def _files(kv: str) -> list[str]:
    return sorted(f for f in os.listdir(kv) if f.endswith(".kv"))


def test_killed_mid_write_then_damaged_files_are_dropped(tmp_path, passage_ids):
    kv = str(tmp_path / "kv")
    a, b = passage_ids[:600], passage_ids[100:700]  # b shares no page with a (its first page differs)
    s = _serve(kv)
    try:
        _gen(s, a)
        deadline = time.time() + 60
        while _disk(s)["pending_writes"] or len(_files(kv)) < 37:
            assert time.time() < deadline, _disk(s)
            time.sleep(0.05)
        # b's pages start to reach the files: kill the whole server group there, mid-write
        t = threading.Thread(target=lambda: _gen_quietly(s, b), daemon=True)
        t.start()
        deadline = time.time() + 60
        while len(_files(kv)) == 37:
            assert time.time() < deadline, "b's pages never reached the files"
            time.sleep(0.002)
        s.kill()
        s.proc.wait(timeout=30)
        t.join(timeout=30)
    finally:
        s.stop()
    files = _files(kv)
    assert len(files) > 37
    # what the crash and a bad disk leave: flipped payload bytes, short files, a write never finished
    corrupt, truncated = files[0:6:2], files[1:6:2]
    for name in corrupt:
        path = os.path.join(kv, name)
        data = bytearray(open(path, "rb").read())
        data[-100] ^= 0xFF
        open(path, "wb").write(bytes(data))
    for name in truncated:
        path = os.path.join(kv, name)
        size = os.path.getsize(path)
        os.truncate(path, size // 2)
    stale = os.path.join(kv, files[6] + ".tmp999999999-1")  # no such pid: its writer is gone
    open(stale, "wb").write(open(os.path.join(kv, files[6]), "rb").read()[:300])
    bad = [os.path.join(kv, n) for n in corrupt + truncated]

    s = _serve(kv)
    try:
        deadline = time.time() + 60
        while _disk(s)["pending_writes"]:  # the scrub counts as a pending write
            assert time.time() < deadline, _disk(s)
            time.sleep(0.05)
        assert _disk(s)["dropped_pages"] == 6
        logs = s.logs()
        for path in bad + [stale]:
            assert f"hicache: dropping {path}" in logs, (path, logs[-3000:])
            assert not os.path.exists(path), path
        assert "payload digest mismatch" in logs and "payload of" in logs  # each damage named as what it is
        for ids in (a, b):
            cold = _gen(s, ids, salt="no-file-has-this-salt")
            assert cold["meta_info"]["cached_tokens"] == 0
            warm = _gen(s, ids)
            assert warm["output_ids"] == cold["output_ids"]
            assert warm["meta_info"]["cached_tokens"] % P == 0
        assert _disk(s)["dropped_pages"] == 6  # what was left is sound: no read found a bad file
        s.wait_idle()
    finally:
        s.stop()


def _gen_quietly(s, ids) -> None:
    """A request the kill cuts off: its connection error is the expected outcome."""
    try:
        _gen(s, ids)
    except (httpx.HTTPError, AssertionError):
        pass
