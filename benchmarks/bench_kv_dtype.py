"""Decode tok/s at a long-ish context by KV pool dtype (issue 26): SmolLM2 (the default GGUF, its own blocks),
batch 1 and 8, prompts of ``--context`` tokens already cached, ``--kv-cache-dtype`` fp32 / fp16 / int8.

Decode seconds = (wall of a generate with ``--new`` tokens - wall of the same with 1 token), both with the
prompt's prefix cached, so the prefill is left out. Run under ``cpuslot --all`` (the whole box) and give the
load from ``uptime``: ``python benchmarks/bench_kv_dtype.py``.
"""

from __future__ import annotations

import argparse
import os
import time

from radixrt import Engine


def prompts(context: int, batch: int) -> list[list[int]]:
    """``batch`` prompts of ``context`` token ids: a shared body (ids 1000-9000, deterministic) and a distinct
    last token each, so each request decodes its own tail."""
    body = [1000 + (i * 7919) % 8000 for i in range(context - 1)]
    return [body + [20000 + b] for b in range(batch)]


def wall(e: Engine, ids: list[list[int]], new: int) -> float:
    sp = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    e.generate(input_ids=ids, sampling_params=sp)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--context", type=int, default=1500)
    ap.add_argument("--new", type=int, default=33)
    ap.add_argument("--kv", default="fp32,fp16,int8")
    ap.add_argument("--quantization", default="auto")
    args = ap.parse_args()
    print("load:", os.getloadavg())
    for kv in args.kv.split(","):
        e = Engine(
            speculative_algorithm="none",
            quantization=args.quantization,
            kv_cache_dtype=kv,
            max_total_tokens=8 * (args.context + 64) + 64,
        )
        try:
            row = []
            for batch in (1, 8):
                ids = prompts(args.context, batch)
                wall(e, ids, 1)  # prefill once: the prompts' prefixes are cached from here on
                base = min(wall(e, ids, 1) for _ in range(2))
                full = min(wall(e, ids, args.new) for _ in range(2))
                row.append(f"batch {batch}: {batch * (args.new - 1) / (full - base):.1f} tok/s")
            mem = e.get_server_info()["memory"]
            print(
                f"kv {kv} ({mem['kv_dtype']}, pool {mem['kv_pool_bytes'] / 2**20:.0f} MiB): " + ", ".join(row),
                flush=True,
            )
        finally:
            e.shutdown()
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
