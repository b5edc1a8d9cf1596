"""Decode stall during a restore (issue 30): how long a running request's decode waits while another request's
2,000-token prefix comes back from tier 2 (host) or tier 3 (files). In-process Engine, default SmolLM2 GGUF.

    python benchmarks/bench_restore_stall.py [--prefix 2000] [--decode 96] [--no-recompute] [--out PATH]

A request R1 streams ``--decode`` tokens; after its 8th token, R2 (the cached prefix + 16 tokens, 1 new
token) is submitted. The pool is full, so R2's restore evicts as many pages (2,000 tokens) as it brings back:
their store into tier 2 (on the store thread, mem/store_async.py; before, on the step at the restore's
landing) falls in the same window, and so does R2's own extend. Reported per source (host, disk): R1's
median inter-token latency (ITL) before R2, its largest ITL (and all of them) while R2 is in flight, and R2's
TTFT and cached_tokens. Writes ``benchmarks/results/restore_stall.json``. Run it under ``cpuslot --all``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixrt import Engine  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "restore_stall.json")


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40000) for _ in range(n)]


def measure(e: Engine, prefix: list[int], rng: random.Random, decode: int) -> dict:
    times: list[float] = []
    r2: dict = {}
    started = threading.Event()

    def second():
        started.wait()
        t0 = time.perf_counter()
        out = e.generate(input_ids=prefix + ids(rng, 16), sampling_params={"max_new_tokens": 1, "temperature": 0})
        r2.update(t0=t0, t1=time.perf_counter(), cached=out["meta_info"]["cached_tokens"])

    t = threading.Thread(target=second)
    t.start()
    for _ in e.generate(
        input_ids=ids(rng, 32),
        stream=True,
        sampling_params={"max_new_tokens": decode, "temperature": 0, "ignore_eos": True},
    ):
        times.append(time.perf_counter())
        if len(times) == 8:
            started.set()
    t.join()
    itl = [(b - a) for a, b in zip(times, times[1:])]
    before = [d for a, d in zip(times[1:], itl) if a <= r2["t0"]]
    during = [d for a, d in zip(times[1:], itl) if r2["t0"] < a <= r2["t1"] + max(itl)]
    return {
        "itl_median_before_ms": 1e3 * statistics.median(before),
        "itl_max_during_ms": 1e3 * max(during or [0]),
        "itl_during_ms": [round(1e3 * d, 1) for d in during],
        "r1_tokens_during_r2": sum(1 for a in times if r2["t0"] < a <= r2["t1"]),
        "r2_ttft_ms": 1e3 * (r2["t1"] - r2["t0"]),
        "r2_cached_tokens": r2["cached"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--decode", type=int, default=96)
    ap.add_argument("--no-recompute", action="store_true", help="skip the (slow) recompute row")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    rng = random.Random(0)
    prefix = ids(rng, a.prefix)
    res: dict = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        e = Engine(
            max_total_tokens=4096,
            context_length=4096,
            log_level="warning",
            hicache_ratio=3.0,
            enable_hierarchical_cache=True,
            hicache_storage=f"file:{d}/kv",
        )
        try:
            e.generate(input_ids=prefix, sampling_params={"max_new_tokens": 1})
            for _ in range(3):  # push the prefix out of the 4,096-token pool into tier 2
                e.generate(input_ids=ids(rng, 1800), sampling_params={"max_new_tokens": 1})
            res["host"] = measure(e, prefix, rng, a.decode)
            e.scheduler.req_pages.hicache.disk.flush()
            assert e.flush_cache()
            res["disk"] = measure(e, prefix, rng, a.decode)
            if a.no_recompute:
                return finish(res, a.out)
            e.flush_cache()
            e.generate(input_ids=ids(rng, 40), sampling_params={"max_new_tokens": 1})
            res["recompute"] = measure(e, ids(rng, a.prefix), rng, a.decode)
        finally:
            e.shutdown()
    finish(res, a.out)


def finish(res: dict, out: str) -> None:
    res["load_after"] = os.getloadavg()
    print(
        json.dumps(
            {
                k: v if not isinstance(v, dict) else {x: y for x, y in v.items() if x != "itl_during_ms"}
                for k, v in res.items()
            },
            indent=1,
        )
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
