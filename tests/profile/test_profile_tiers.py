"""Issue 30, ``radixrt profile`` with cache tiers: the replay runs the server's ``HiCache`` under its tree
(``profile/tiers.py``), so a log's hit rate is split by where the pages came from: the pool, tier 2 (host),
tier 3 (files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixrt.runtime.profile.replay import ReplayReq, replay
from radixrt.runtime.profile.report import format_table, profile

ROOT = Path(__file__).resolve().parents[2]


def round_robin(rounds: int = 5) -> list[ReplayReq]:
    """Three 64-token prompts (4 pages of 16), one output token each: 3 cacheable pages a repeat."""
    prompts = [list(range(1000 * (i + 1), 1000 * (i + 1) + 64)) for i in range(3)]
    return [ReplayReq(64, 1, prompts[k % 3] + [7]) for k in range(3 * rounds)]


def test_tier2_turns_lru_misses_into_hits():
    """A 9-page pool alone always evicts the prompt needed next (0 hits, test_profile.py). With 8 host pages
    under it every one of the 12 repeats hits its 3 pages (12 x 48 = 576 of 960 tokens): 8 of them from
    tier 2, 4 in the pool itself (with a tier the pool gives up only the pages asked for)."""
    reqs = round_robin()
    assert replay(reqs, 9, 16, "lru").hit_tokens == 0
    r = replay(reqs, 9, 16, "lru", host_pages=8)
    assert (r.hit_tokens, r.host_hit_tokens, r.disk_hit_tokens, r.query_tokens) == (576, 384, 0, 960)


def test_tier3_holds_what_tier2_cannot():
    """With 1 host page the pages fall through to an unbounded tier 3 (write_through: written when they
    enter the tree), and every repeat still hits its 3 pages; without tier 3, or with one of 4 files (fewer
    than the 12 pages cycled through it, so LRU keeps none that is asked for), a third of them miss."""
    reqs = round_robin()
    r = replay(reqs, 9, 16, "lru", host_pages=1, disk_pages=0)
    assert (r.hit_tokens, r.host_hit_tokens, r.disk_hit_tokens) == (576, 192, 192)
    none = replay(reqs, 9, 16, "lru", host_pages=1)
    assert (none.hit_tokens, none.host_hit_tokens) == (384, 192)
    small = replay(reqs, 9, 16, "lru", host_pages=1, disk_pages=4)  # 4 files: too few for 3 x 4 pages
    assert (small.hit_tokens, small.disk_hit_tokens) == (384, 0)


def test_profile_rows_split_the_hit_rate_by_tier():
    rows = profile(round_robin(), [16], [144], ["lru"], tier2_tokens=128, tier3_tokens=0)
    assert len(rows) == 1
    r = rows[0]
    assert (r.saved_tokens, r.host_hit_rate, r.disk_hit_rate) == (576, 0.4, 0.0)
    assert "from tier 2" in format_table(rows) and "40.0%" in format_table(rows)
    with pytest.raises(ValueError, match="tier3_tokens needs tier2_tokens"):
        profile(round_robin(), [16], [144], ["lru"], tier3_tokens=0)


def test_cli_takes_tier_sizes(tmp_path):
    log = tmp_path / "log.jsonl"
    with open(log, "w") as f:
        for k, r in enumerate(round_robin()):
            f.write(
                json.dumps(
                    {
                        "prompt_len": 64,
                        "output_len": 1,
                        "prompt_ids": r.key[:64],
                        "output_ids": [7],
                        "arrival": float(k),
                    }
                )
                + "\n"
            )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixrt.runtime.server.launch",
            "profile",
            str(log),
            "--cache-sizes",
            "144",
            "--page-sizes",
            "16",
            "--policies",
            "lru",
            "--sequential",
            "--tier2-tokens",
            "128",
            "--plot",
            "",
            "--json",
            str(tmp_path / "rows.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["saved_tokens"], r["host_hit_rate"], r["disk_hit_rate"]) for r in rows] == [(576, 0.4, None)]
    assert "from tier 3" in out.stdout
    # sizes the replay cannot hold are refused by name, not a traceback
    for flag, n, said in (
        ("--tier2-tokens", "7", "tier2_tokens: 7 tokens hold no page of 16 tokens"),
        ("--tier2-tokens", str(10**20), "tier2_tokens: at most 268435456 tokens"),
        ("--tier3-tokens", str(10**20), "tier3_tokens: at most 268435456 tokens"),
    ):
        extra = ["--tier2-tokens", "128"] if flag == "--tier3-tokens" else []
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "radixrt.runtime.server.launch",
                "profile",
                str(log),
                "--cache-sizes",
                "144",
                "--page-sizes",
                "16",
                *extra,
                flag,
                n,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    # no --plot: no picture is written into the working directory
    quiet = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixrt.runtime.server.launch",
            "profile",
            str(log),
            "--cache-sizes",
            "144",
            "--page-sizes",
            "16",
            "--policies",
            "lru",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert quiet.returncode == 0 and "plot:" not in quiet.stdout, quiet.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "rows.json"]
