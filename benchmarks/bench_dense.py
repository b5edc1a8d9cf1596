"""Dense CPU products (``radixrt_gemv.gemv``, radixrt/kernels/gemv) per weight dtype and shape, against the
machine's memory roofline at 1 row and oneDNN's fp32 inner product at many rows, in the same run.

- ``m1``: one row through ``--copies-mb`` of distinct copies of the weight (so none is in cache, as in a
  whole model's decode step): GB/s of weight read, its ratio to ``roofline.read_gbps()`` measured at the
  start of the run, and the products per second relative to fp32's.
- ``mN`` (``--rows``, default 512): GFLOP/s, and the ratio to oneDNN fp32
  (``torch.ops.mkldnn._linear_pointwise`` over ``_reorder_linear_weight``, what ``DenseWeight`` ran above
  8 rows before) timed in the same round.

Each figure is the best of ``--reps`` rounds; a round times every candidate of a shape in turn, so the ratios
compare the same state of the machine. Shapes: Llama-3.2-1B (K=2048 N=2048, K=2048 N=8192, K=8192 N=2048)
and SmolLM2-135M (K=576 N=576, K=576 N=1536, K=1536 N=576). Writes ``benchmarks/results/dense.json``.
Run: ``flock /tmp/bench.lock .venv/bin/python benchmarks/bench_dense.py`` on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from roofline import read_gbps  # noqa: E402

from radixrt.kernels import cpp  # noqa: E402
from radixrt.kernels.gemv import pack_panels  # noqa: E402

SHAPES = {
    "llama-3.2-1b": [(2048, 2048), (2048, 8192), (8192, 2048)],
    "smollm2-135m": [(576, 576), (576, 1536), (1536, 576)],
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def best_of(fns: dict, reps: int) -> dict:
    """``{name: best seconds}`` of ``fns`` (each a no-argument callable), timed in turn per round."""
    for f in fns.values():
        f()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(reps):
        for name, f in fns.items():
            t = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def bench_m1(op, k: int, n: int, copies_mb: int, reps: int, roof: float) -> dict:
    w = torch.randn(n, k)
    x = torch.randn(1, k)
    packs = {}
    for name, dt in DTYPES.items():
        p = pack_panels(w.to(dt))
        copies = max(2, copies_mb * 2**20 // (p.numel() * p.element_size()))
        packs[name] = [p] + [p.clone() for _ in range(copies - 1)]

    def run(ps):
        return lambda: [op(x, p) for p in ps]

    best = best_of({name: run(ps) for name, ps in packs.items()}, reps)
    out = {}
    for name, ps in packs.items():
        sec = best[name] / len(ps)
        gbps = ps[0].numel() * ps[0].element_size() / sec / 1e9
        out[name] = {
            "us": round(sec * 1e6, 1),
            "gbps": round(gbps, 2),
            "vs_roofline": round(gbps / roof, 3),
            "speed_vs_fp32": round(best["fp32"] / len(packs["fp32"]) / sec, 3),
        }
    return out


def bench_mn(op, m: int, k: int, n: int, reps: int) -> dict:
    w, x = torch.randn(n, k), torch.randn(m, k)
    fns = {}
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        fns["onednn_fp32"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    for name, dt in DTYPES.items():
        fns[name] = (lambda p: lambda: op(x, p))(pack_panels(w.to(dt)))
    best = best_of(fns, reps)
    flops = 2 * m * n * k
    out = {}
    for name, sec in best.items():
        out[name] = {"ms": round(sec * 1e3, 3), "gflops": round(flops / sec / 1e9, 1)}
        if "onednn_fp32" in best and name != "onednn_fp32":
            out[name]["vs_onednn_fp32"] = round(best["onednn_fp32"] / sec, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--copies-mb", type=int, default=256, help="distinct weight bytes per M=1 figure")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dense.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    op = cpp.ops("radixrt_gemv")
    if op is None:
        raise SystemExit("bench_dense: the C++ kernels are unavailable (RADIXRT_DISABLE_CPP_KERNELS or no build)")
    op = op.gemv
    roof = read_gbps()
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": args.threads,
            "loadavg_start": os.getloadavg()[0],
            "read_gbps": round(roof, 2),
        },
        "rows": args.rows,
        "shapes": [],
    }
    print(f"memory roofline {roof:.1f} GB/s, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    with torch.inference_mode():
        for model in args.models.split(","):
            for k, n in SHAPES[model]:
                m1 = bench_m1(op, k, n, args.copies_mb, args.reps, roof)
                mn = bench_mn(op, args.rows, k, n, args.reps)
                result["shapes"].append({"model": model, "K": k, "N": n, "m1": m1, f"m{args.rows}": mn})
                print(
                    f"{model} K={k} N={n}\n  M=1   "
                    + "  ".join(
                        f"{d} {v['gbps']:.1f} GB/s ({v['vs_roofline']:.2f} roof, {v['speed_vs_fp32']:.2f}x fp32)"
                        for d, v in m1.items()
                    )
                    + f"\n  M={args.rows} "
                    + "  ".join(
                        f"{d} {v['gflops']:.1f} GF"
                        + (f" ({v['vs_onednn_fp32']:.2f}x)" if "vs_onednn_fp32" in v else "")
                        for d, v in mn.items()
                    ),
                    flush=True,
                )
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
