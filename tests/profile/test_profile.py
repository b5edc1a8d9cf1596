"""``radixrt profile``: replay through the radix tree on synthetic logs whose hit rates are known exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from radixrt.runtime.mem.eviction import POLICIES
from radixrt.runtime.scheduler.request_log import RequestLog, page_hashes
from radixrt.runtime.profile.logs import read_request_log
from radixrt.runtime.profile.replay import ReplayReq, pages_needed, replay
from radixrt.runtime.profile.report import profile
from radixrt.runtime.server.cli.chat_log import read_openai_jsonl

ROOT = Path(__file__).resolve().parents[2]


def req(prompt: list[int], output: list[int], **kw) -> ReplayReq:
    return ReplayReq(len(prompt), len(output), prompt + output, **kw)


def unique(n: int, base: int) -> list[int]:
    return list(range(base, base + n))


def test_disjoint_prompts_hit_nothing() -> None:
    reqs = [req(unique(100, 1000 * i), unique(10, 1000 * i + 500)) for i in range(1, 9)]
    for row in profile(reqs, [1, 16], [64, 4096]):
        assert row.hit_rate == 0.0 and row.optimal_hit_rate == 0.0 and row.saved_tokens == 0
        assert row.query_tokens == 800


@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_one_shared_prefix_gives_its_exact_share(page_size: int) -> None:
    n, shared, own = 10, 256, 40  # 256 is a whole number of pages for every page size here
    prefix = unique(shared, 10_000)
    reqs = [req(prefix + unique(own, 100_000 * (i + 1)), unique(8, 100_000 * (i + 1) + 500)) for i in range(n)]
    want = Fraction((n - 1) * shared, n * (shared + own))
    rows = profile(reqs, [page_size], [8192])
    assert len(rows) == len(POLICIES)
    for row in rows:
        assert Fraction(row.saved_tokens, row.query_tokens) == want
        assert row.hit_rate == pytest.approx(float(want), abs=0) and row.optimal_hit_rate == row.hit_rate
        assert row.overflow == 0


def test_cache_too_small_for_the_working_set_lru_misses_every_time() -> None:
    """Three 64-token prompts (4 pages of 16) requested round-robin, one output token each. A 9-page pool
    holds two of them besides the request running: LRU always evicts the one needed next (0 hits). With 13
    pages all three stay and every repeat hits its 3 cacheable whole pages (the last token is computed)."""
    prompts = [unique(64, 1000 * (i + 1)) for i in range(3)]
    rounds = 5
    reqs = [req(prompts[k % 3], [7]) for k in range(3 * rounds)]
    small = replay(reqs, 9, 16, "lru")
    assert (small.hit_tokens, small.query_tokens, small.overflow) == (0, 3 * rounds * 64, 0)
    assert small.evicted_pages == (3 * rounds - 2) * 4
    big = replay(reqs, 13, 16, "lru")
    assert big.hit_tokens == 3 * (rounds - 1) * 48 and big.evicted_pages == 0
    assert replay(reqs, pages_needed(reqs, 16), 16).hit_tokens == big.hit_tokens


def test_timed_replay_overlap_decides_the_hit() -> None:
    shared = unique(64, 50)
    a = req(shared + [1] * 16, [2] * 4, start=0.0, prefill_done=1.0, finish=2.0)
    b_early = req(shared + [3] * 16, [4] * 4, start=0.5, prefill_done=1.5, finish=2.5)
    b_late = req(shared + [3] * 16, [4] * 4, start=1.2, prefill_done=1.7, finish=2.5)
    assert replay([a, b_early], 100, 16).hit_tokens == 0  # A's prompt was not in the tree yet
    assert replay([a, b_late], 100, 16).hit_tokens == 64
    seq = [req(shared + [1] * 16, [2] * 4), req(shared + [3] * 16, [4] * 4)]
    assert replay(seq, 100, 16).hit_tokens == 64


def write_log(path: Path, reqs: list[tuple[list[int], list[int]]], hash_pages: bool) -> None:
    log = RequestLog(str(path), 16, hash_pages)
    for i, (p, o) in enumerate(reqs):
        t = float(i)
        log.write(
            rid=f"r{i}",
            arrival=t,
            admit=t,
            prefill_done=t + 0.1,
            finish=t + 0.2,
            prompt_ids=p,
            output_ids=o,
            cacheable_len=len(p) - 1,
            cache_salt="tenant" if i % 4 == 3 else None,
            cached_tokens=0,
            finish_reason="length",
        )
    log.close()


def test_hash_log_profiles_like_the_token_log(tmp_path: Path) -> None:
    system = unique(96, 7)
    convo = [(system + unique(30 + 7 * i, 1000 * (i + 1)), unique(20, 1000 * (i + 1) + 900)) for i in range(8)]
    write_log(tmp_path / "ids.jsonl", convo, False)
    write_log(tmp_path / "hash.jsonl", convo, True)
    lines = (tmp_path / "hash.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert "prompt_ids" not in first and first["page_size"] == 16
    assert first["page_hashes"] == page_hashes(convo[0][0] + convo[0][1], 16) and len(first["page_hashes"]) == 9
    assert first["cache_salt"] is None and json.loads(lines[3])["cache_salt"] not in (None, "tenant")
    by_ids = profile(read_request_log(str(tmp_path / "ids.jsonl")), [16, 32], [160, 320, 4096])
    by_hash = profile(read_request_log(str(tmp_path / "hash.jsonl")), [16, 32], [160, 320, 4096])
    assert [(r.hit_rate, r.saved_tokens) for r in by_ids] == [(r.hit_rate, r.saved_tokens) for r in by_hash]
    # the 6 un-salted requests share the 96-token system prompt (5 hits), the 2 salted ones their own (1 hit)
    assert by_ids[-1].saved_tokens == 96 * 5 + 96
    with pytest.raises(ValueError, match="multiple"):
        profile(read_request_log(str(tmp_path / "hash.jsonl")), [8], [4096])


def test_openai_jsonl_uses_the_chat_template(tmp_path: Path, tokenizer) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "web search",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    lines = [
        {
            "messages": [system, {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
            "tools": tools,
            "response": f"It is {2 * i}.",
        }
        for i in range(4)
    ]
    lines.append({"body": {"messages": [system, {"role": "user", "content": "batch form"}]}})
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    reqs = read_openai_jsonl(str(path), tokenizer)
    assert len(reqs) == 5
    prompts = [tokenizer.decode(r.key[: r.prompt_len]) for r in reqs]
    assert all('"name": "search"' in p for p in prompts[:4]) and "search" not in prompts[4]
    assert prompts[1].startswith("<|im_start|>system\nYou are a careful assistant.")
    assert prompts[2].endswith("Question 2: what is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert reqs[3].key[reqs[3].prompt_len :] == tokenizer.encode("It is 6.", add_special_tokens=False)
    # the exact hits of an unbounded, token-granular cache, by brute force over what came before
    want, seen = 0, []
    for r in reqs:
        cap = r.prompt_len - 1
        want += max(
            (next((k for k, (x, y) in enumerate(zip(r.key[:cap], s)) if x != y), min(cap, len(s))) for s in seen),
            default=0,
        )
        seen.append(r.key[: r.prompt_len + r.output_len - 1])
    res = replay(reqs, pages_needed(reqs, 1), 1)
    assert res.hit_tokens == want and want > 4 * 100 and res.query_tokens == sum(r.prompt_len for r in reqs)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: 'messages'"):
        read_openai_jsonl(str(bad), tokenizer)


def test_cli_prints_table_and_writes_plot(tmp_path: Path) -> None:
    system = unique(128, 5)
    write_log(
        tmp_path / "log.jsonl", [(system + unique(20, 1000 * i), unique(8, 1000 * i + 500)) for i in range(1, 7)], False
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixrt.runtime.server.launch",
            "profile",
            str(tmp_path / "log.jsonl"),
            "--cache-sizes",
            "256,1024",
            "--page-sizes",
            "16",
            "--prefill-tokens-per-s",
            "1000",
            "--plot",
            str(tmp_path / "p.png"),
            "--json",
            str(tmp_path / "rows.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "prefill tokens saved" in out.stdout and "6 requests, 888 prompt tokens" in out.stdout
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 2 * len(POLICIES)
    full = [r for r in rows if r["cache_tokens"] == 1024]
    # request 3 of 6 has its own salt: 4 of the other 5 hit the 128-token system prompt, at 1000 tokens/s
    assert all(r["saved_tokens"] == 4 * 128 and r["saved_seconds"] == pytest.approx(0.512) for r in full)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixrt.runtime.server.launch",
            "profile",
            str(tmp_path / "log.jsonl"),
            "--policies",
            "lru,nope",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "policies" in bad.stderr
    # a record without timings replays (admitted, prefilled and finished at its arrival); a bad value names
    # its line
    rec = {"prompt_len": 3, "output_len": 2, "prompt_ids": [1, 2, 3], "output_ids": [4, 5]}
    (tmp_path / "untimed.jsonl").write_text(
        json.dumps({**rec, "arrival": 1.0}) + "\n" + json.dumps({**rec, "arrival": 2.0, "admit": 2.5}) + "\n"
    )
    (tmp_path / "bad.jsonl").write_text(json.dumps({**rec, "arrival": 1.0, "ttft": "x"}) + "\n")
    args = ["--cache-sizes", "64", "--page-sizes", "1", "--policies", "lru", "--plot", str(tmp_path / "q.png")]
    ok = subprocess.run(
        [sys.executable, "-m", "radixrt.runtime.server.launch", "profile", str(tmp_path / "untimed.jsonl"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0 and "2 requests, 6 prompt tokens" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "radixrt.runtime.server.launch", "profile", str(tmp_path / "bad.jsonl"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "bad.jsonl:1: bad field value" in bad.stderr, bad.stderr
