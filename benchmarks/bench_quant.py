"""Weight formats side by side (issue 26): the whole model's projections (30 layers x 4 fused projections +
the LM head) at M rows, per format (``auto``: the GGUF's own blocks; ``none``/``fp16``/``bf16``: the panel
kernel; ``int8``/``q4``: Q8_0/Q4_1 blocks). Every format runs one kernel at every row count.

Each cell is the best of ``--reps`` rounds in milliseconds; a round times every format in turn at that row
count, so the formats compared share the machine's state of the moment. ``--cpu-time`` measures the thread's CPU time
instead of wall time with one torch thread (steadier on a shared machine).
Run: ``flock /tmp/bench.lock python benchmarks/bench_quant.py``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.gguf_load import build_from_gguf
from radixrt.runtime.models.loader import default_gguf_path, load_config


def load(fmt: str) -> list[nn.Module]:
    model = build_from_gguf(default_gguf_path(), ModelArgs.from_hf(load_config(None)), fmt)
    return [m for n, m in model.named_modules() if n.endswith("_proj")] + [model.lm_head]


def in_features(mod: nn.Module) -> int:
    if hasattr(mod, "in_features"):
        return mod.in_features
    if hasattr(mod, "parts"):
        return in_features(mod.parts[0])
    return mod.fp32.shape[1]


def time_ms(mods, m: int, reps: int, clock) -> float:
    xs = {k: torch.randn(m, k) for k in (576, 1536)}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps + 1):
            t = clock()
            for mod in mods:
                mod(xs[in_features(mod)])
            best = min(best, clock() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--formats", default="auto,none,fp16,bf16,int8,q4")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args()
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.thread_time
    rows = [int(r) for r in args.rows.split(",")]
    print(f"whole-model projections, ms ({'1-thread CPU time' if args.cpu_time else 'wall'}, best of {args.reps})")
    print("format " + "".join(f"{f'M={r}':>9}" for r in rows))
    fmts = args.formats.split(",")
    models = {fmt: load(fmt) for fmt in fmts}
    # formats interleaved per row count (best of reps rounds): this VM's speed drifts 2x within minutes
    ts = {fmt: [] for fmt in fmts}
    for r in rows:
        best = {fmt: float("inf") for fmt in fmts}
        for _ in range(args.reps):
            for fmt in fmts:
                best[fmt] = min(best[fmt], time_ms(models[fmt], r, 1, clock))
        for fmt in fmts:
            ts[fmt].append(best[fmt])
    base = ts[fmts[0]]
    for fmt in fmts:
        print(
            f"{fmt:6} "
            + "".join(f"{t:9.1f}" for t in ts[fmt])
            + f"   vs {fmts[0]}: "
            + " ".join(f"{b / t:.2f}x" for b, t in zip(base, ts[fmt])),
            flush=True,
        )


if __name__ == "__main__":
    main()
