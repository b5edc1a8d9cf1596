"""Eviction policies against LRU: hit rate at several cache sizes, replayed through the radix tree (no model).

    python benchmarks/bench_eviction.py                 # agent-churn traces + the suite's workloads
    python benchmarks/bench_eviction.py --no-suite      # synthetic traces only (no tokenizer)

Cache sizes run from what the largest request needs (share 0) to the trace's footprint (share 1: the pages an unbounded
cache ends up holding), at the shares in ``SHARES`` of the distance between the two. Prints one line per trace and size,
``policy - lru`` in points, and whether each policy stays within 1 point of LRU everywhere (the bar for becoming the
default). Writes ``benchmarks/results/eviction.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eviction_traces as T  # noqa: E402

from radixrt.runtime.mem.eviction import POLICIES  # noqa: E402
from radixrt.runtime.profile.replay import Replayer, pages_needed, replay  # noqa: E402

SHARES = (0.0, 0.02, 0.05, 0.1, 0.25, 0.5)


def footprint(reqs, page: int) -> int:
    """Pages held by an unbounded cache after the whole trace."""
    r = Replayer(pages_needed(reqs, page), page)
    r.run(reqs)
    return r.tree.total_pages_in_tree


def sweep(name: str, reqs, page: int, shares=SHARES) -> list[dict]:
    foot = footprint(reqs, page)
    floor = max(-(-(r.prompt_len + r.output_len) // page) for r in reqs) + 1
    opt = replay(reqs, pages_needed(reqs, page), page).hit_rate
    rows = []
    for s in shares:
        pages = floor + int((foot - floor) * s)
        row = {"trace": name, "share": s, "pages": pages, "tokens": pages * page, "opt": opt}
        for pol in POLICIES:
            row[pol] = replay(reqs, pages, page, pol).hit_rate
        rows.append(row)
        deltas = "  ".join(f"{p} {100 * (row[p] - row['lru']):+5.1f}" for p in POLICIES if p != "lru")
        print(
            f"{name:<22} {s:>4.0%} ({pages * page:>6} tok)  lru {100 * row['lru']:5.1f}%  "
            + "  ".join(f"{p} {100 * row[p]:5.1f}%" for p in POLICIES if p != "lru")
            + f"  | vs lru: {deltas}  (opt {100 * opt:.1f}%)",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--no-suite", action="store_true", help="skip the benchmark suite's workloads")
    ap.add_argument("--out", default="benchmarks/results/eviction.json")
    a = ap.parse_args()
    t0 = time.time()
    traces = {f"agent-churn c={c}": T.agent_churn(churn=c) for c in (1, 4, 12)}
    traces["agent-churn long-tool"] = T.agent_churn(agents=16, calls=4, churn=8, obs_len=400)
    traces["phase-shift"] = T.phase_shift()
    if not a.no_suite:
        from radixrt.runtime.models.loader import load_tokenizer

        traces.update(T.suite(load_tokenizer()))
    rows = []
    for name, reqs in traces.items():
        rows += sweep(name, reqs, a.page_size)
    worst = {p: min(r[p] - r["lru"] for r in rows) for p in POLICIES if p != "lru"}
    for p, w in worst.items():
        verdict = "never more than 1 point below LRU" if w >= -0.01 else "more than 1 point below LRU somewhere"
        print(f"{p}: worst {100 * w:+.1f} points vs lru -> {verdict}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(
            {"page_size": a.page_size, "rows": rows, "worst_vs_lru": worst, "seconds": time.time() - t0}, f, indent=1
        )


if __name__ == "__main__":
    main()
