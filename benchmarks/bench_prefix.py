"""Shared-prefix workload, cache on vs off (issue 3).

64 requests in 4 groups; each group shares a 1024-token system prompt; each request has its own
64-token question and 32 output tokens (ignore_eos); all submitted at once. Reports throughput (total and
output tok/s), mean and P99 TTFT, the hit rate against the optimal one (shared tokens / all prompt
tokens, counting each group's first request as a miss), and the tree + scheduler's own time per step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from roofline import percentile  # noqa: E402

from radixrt import Engine  # noqa: E402


def workload(groups: int, per_group: int, sys_len: int, q_len: int, seed: int = 0, vocab=(100, 40000)):
    rng = random.Random(seed)
    systems = [[rng.randrange(*vocab) for _ in range(sys_len)] for _ in range(groups)]
    reqs = [systems[g] + [rng.randrange(*vocab) for _ in range(q_len)] for g in range(groups) for _ in range(per_group)]
    rng.shuffle(reqs)
    return reqs


def run(engine, reqs, new_tokens: int) -> dict:
    sp = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    s = engine.scheduler
    s.stats.step_time = s.stats.forward_time = 0.0
    t = time.perf_counter()
    outs = engine.generate(input_ids=reqs, sampling_params=sp)
    wall = time.perf_counter() - t
    prompt = sum(len(r) for r in reqs)
    out_tok = sum(o["meta_info"]["completion_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    ttft = [o["meta_info"]["ttft"] for o in outs]
    return {
        "wall_s": wall,
        "total_tps": (prompt + out_tok) / wall,
        "output_tps": out_tok / wall,
        "ttft_mean": sum(ttft) / len(ttft),
        "ttft_p99": percentile(ttft, 99),
        "hit_rate": cached / prompt,
        "overhead_share": s.stats.sched_time / max(s.stats.step_time, 1e-9),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--question-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default="benchmarks/results/bench_prefix.json")
    a = ap.parse_args()
    reqs = workload(a.groups, a.per_group, a.system_len, a.question_len)
    n = len(reqs)
    optimal = (n - a.groups) * a.system_len / sum(len(r) for r in reqs)
    res = {}
    for name, kw in (("cache_on", {}), ("cache_off", {"disable_radix_cache": True})):
        e = Engine(max_total_tokens=32768, max_running_requests=64, **kw)
        e.generate(input_ids=reqs[0][:32], sampling_params={"max_new_tokens": 1})  # warm-up
        e.flush_cache()
        res[name] = run(e, reqs, a.new_tokens)
        e.shutdown()
        r = res[name]
        print(
            f"{name:9s}: {r['total_tps']:8.1f} tok/s total, {r['output_tps']:6.1f} out tok/s, "
            f"TTFT mean {r['ttft_mean']:.2f}s P99 {r['ttft_p99']:.2f}s, hit rate {r['hit_rate']:.3f} "
            f"(optimal {optimal:.3f}), tree+scheduler {r['overhead_share']:.2%} of step time"
        )
    on, off = res["cache_on"], res["cache_off"]
    print(
        f"speedup cache on / off: {on['total_tps'] / off['total_tps']:.1f}x throughput; "
        f"hit rate {on['hit_rate'] / optimal:.1%} of optimal"
    )
    res["optimal_hit_rate"] = optimal
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
