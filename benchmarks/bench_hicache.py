"""Cache tiers under the radix tree (issue 30), in-process Engine, default SmolLM2 GGUF (Q4_1 blocks, fp16 KV).

    python benchmarks/bench_hicache.py [--pool 2048] [--sessions 16] [--prefix 512] [--rounds 3] [--pairs 3]
        [--only unique|ttft] [--ttft-tokens N] [--out PATH]

1. Agent trace, working set = sessions x prefix tokens (4x the pool by default), each session revisited
   ``rounds`` times in shuffled order with a fresh 32-token suffix: hit rate and req/s for the pool alone,
   the pool with tier 2 (host store 3x the pool: the same bytes in all), and a pool 4x larger (no tier).
2. TTFT (wall time of a 1-token request) of a 1,024-token prefix (at most half the pool): recomputed, restored from tier
2,
   restored from tier 3 (files), and after a restart (a new Engine on the same directory).
3. The cost of tier 2 when nothing is revisited: req/s of unique prompts, tier off then on, ``--pairs`` times
   (alternating engines); the ratio is the median of the pairs' ratios.
Writes ``benchmarks/results/hicache.json``. Run it under ``cpuslot --all`` (it times the whole box).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixrt import Engine  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "hicache.json")
G = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40000) for _ in range(n)]


def engine(pool: int, **kw) -> Engine:
    return Engine(max_total_tokens=pool, context_length=4096, log_level="warning", **kw)


def agent_trace(a) -> list[list[int]]:
    rng = random.Random(0)
    prefixes = [ids(rng, a.prefix) for _ in range(a.sessions)]
    order = [s for _ in range(a.rounds) for s in rng.sample(range(a.sessions), a.sessions)]
    return [prefixes[s] + ids(rng, 32) for s in order]


def run_trace(e: Engine, trace: list[list[int]]) -> dict:
    t0 = time.perf_counter()
    for p in trace:  # one at a time: an agent's turn waits for the previous one
        e.generate(input_ids=p, sampling_params=G)
    dt = time.perf_counter() - t0
    c = e.get_server_info()["cache"]
    return {
        "req_per_s": len(trace) / dt,
        "seconds": dt,
        "hit_rate": c["hit_tokens"] / c["query_tokens"],
        "tiers": c.get("hicache"),
    }


def ttft(e: Engine, p: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = e.generate(input_ids=p, sampling_params={**G, "max_new_tokens": 1})
    return time.perf_counter() - t0, out["meta_info"]["cached_tokens"]


def ttft_section(a, kv_dir: str) -> dict:
    rng = random.Random(1)
    n = a.ttft_tokens or min(1024, a.pool // 2)
    p = ids(rng, n)
    fillers = [ids(rng, n) for _ in range(3)]
    e = engine(a.pool, enable_hierarchical_cache=True, hicache_ratio=4.0, hicache_storage=f"file:{kv_dir}")
    out = {}
    ttft(e, ids(rng, n))  # warm-up: the first request of a process pays one-time costs
    out["recompute_s"], _ = ttft(e, p)
    for f in fillers:  # push p out of the pool into tier 2
        e.generate(input_ids=f, sampling_params=G)
    out["host_s"], out["host_cached"] = ttft(e, p)
    e.scheduler.req_pages.hicache.disk.flush()
    e.flush_cache()  # pool and tier 2 emptied; the files stay
    out["disk_s"], out["disk_cached"] = ttft(e, p)
    warm, _ = ttft(e, p)
    out["pool_hit_s"] = warm
    e.scheduler.req_pages.hicache.disk.flush()
    e.shutdown()
    e = engine(a.pool, enable_hierarchical_cache=True, hicache_ratio=4.0, hicache_storage=f"file:{kv_dir}")
    out["restart_s"], out["restart_cached"] = ttft(e, p)
    e.shutdown()
    for k in ("host", "disk", "restart"):
        out[f"{k}_over_recompute"] = out[f"{k}_s"] / out["recompute_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", type=int, default=2048)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unique", type=int, default=24, help="requests of the nothing-revisited section")
    ap.add_argument("--pairs", type=int, default=3, help="tier off/on pairs of the nothing-revisited section")
    ap.add_argument("--only", choices=["unique", "ttft"], help="run that section alone")
    ap.add_argument("--ttft-tokens", type=int, default=0, help="prefix of the TTFT section (0: min(1024, pool/2))")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    trace = agent_trace(a)
    res: dict = {"args": vars(a), "load": os.getloadavg(), "working_set_tokens": a.sessions * a.prefix}
    # tier 2 at 3x the pool: pool + tier 2 hold what the 4x pool holds
    tier2 = {"enable_hierarchical_cache": True, "hicache_ratio": 3.0}
    sections = [] if a.only else [("pool", {}), ("pool+tier2", tier2), ("pool_x4", {"pool": 4 * a.pool})]
    for name, kw in sections:
        e = engine(kw.pop("pool", a.pool), **kw)
        res[name] = run_trace(e, trace)
        e.shutdown()
        print(name, {k: v for k, v in res[name].items() if k != "tiers"}, flush=True)
    if a.only != "unique":
        with tempfile.TemporaryDirectory() as d:
            res["ttft"] = ttft_section(a, os.path.join(d, "kv"))
        print("ttft", res["ttft"], flush=True)
    if not a.only:
        res["tier2_speedup"] = res["pool+tier2"]["req_per_s"] / res["pool"]["req_per_s"]
        res["hit_rate_gap_vs_x4_points"] = 100 * (res["pool_x4"]["hit_rate"] - res["pool+tier2"]["hit_rate"])
    rng = random.Random(2)
    unique = [ids(rng, min(512, a.pool // 2)) for _ in range(a.unique)]
    ratios = []
    for i in range(a.pairs if a.only != "ttft" else 0):
        for name, kw in (("unique_off", {}), ("unique_tier2", {"enable_hierarchical_cache": True})):
            e = engine(a.pool, **kw)
            res[f"{name}_{i}"] = run_trace(e, unique)
            e.shutdown()
            print(name, i, {k: v for k, v in res[f"{name}_{i}"].items() if k != "tiers"}, flush=True)
        ratios.append(res[f"unique_tier2_{i}"]["req_per_s"] / res[f"unique_off_{i}"]["req_per_s"])
    if ratios:
        res["unique_cost_ratios"], res["unique_cost_ratio"] = ratios, statistics.median(ratios)
    res["load_after"] = os.getloadavg()
    print(
        {
            k: res[k]
            for k in ("tier2_speedup", "hit_rate_gap_vs_x4_points", "unique_cost_ratios", "unique_cost_ratio")
            if k in res
        }
    )
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
