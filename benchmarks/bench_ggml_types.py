"""radixrt_ggml.mm per GGUF type at Llama-3.2-1B's projection shapes.

M=1 (decode, memory-bound; cycling over copies of the weight so that it comes from DRAM): weight GB/s
against the machine's read bandwidth measured in the same run (``roofline.read_gbps``). M=512 (prefill,
compute-bound): GFLOP/s-equivalent (2 M N K / time), beside torch's fp32 matmul at the same shape on an fp32
copy of the weight (the ratio is what compares across machines).
Prints one line per type and shape and writes ``benchmarks/results/ggml_types.json``.

Run alone on a quiet machine: ``flock /tmp/bench.lock python benchmarks/bench_ggml_types.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from roofline import read_gbps  # noqa: E402

from radixrt.kernels import quant  # noqa: E402

CACHE_BYTES = 96 << 20  # more than the last-level cache
SHAPES = [(2048, 2048), (2048, 8192), (8192, 2048)]  # (K, N): attention/o-proj, gate/up, down
F16_AT = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def random_blocks(t: quant.GGMLType, n: int, k: int, rng) -> torch.Tensor:
    """Random bytes with small positive fp16 scales where the type keeps them."""
    b = rng.integers(0, 256, size=(n, k // t.block_size, t.type_size), dtype=np.uint8)
    for off in F16_AT[t.name]:
        v = rng.uniform(0.5, 1.5, size=b.shape[:2]).astype(np.float16) * np.float16(0.001)
        b[..., off : off + 2] = v.view(np.uint8).reshape(*b.shape[:2], 2)
    return torch.from_numpy(b.reshape(n, -1))


def timeit(fn, min_s: float, min_reps: int = 3) -> float:
    """Median seconds per call over at least min_reps calls and min_s seconds, after a warm-up call."""
    fn()
    ts, start = [], time.perf_counter()
    while len(ts) < min_reps or time.perf_counter() - start < min_s:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def vs_llama_bench(ops, gguf_path: str, llama_bench: str, rows: int = 512) -> dict:
    """The 2-D ``blk.*`` weights of a GGUF file at ``rows`` activation rows through radixrt_ggml.mm, against
    ``llama-bench -p rows -n 0`` on the same file (its time also covers attention and norms: ours is the
    matmuls alone). Returns both as tok/s and GFLOP/s-equivalent of those matmuls."""
    import subprocess

    from gguf import GGUFReader

    ws = [
        (
            int(t.tensor_type),
            torch.from_numpy(np.array(t.data)).reshape(int(t.shape[1]), -1).contiguous(),
            int(t.shape[0]),
        )
        for t in GGUFReader(gguf_path).tensors
        if t.name.startswith("blk.") and len(t.shape) == 2
    ]
    xs = {k: torch.randn(rows, k) for _, _, k in ws}
    ours = timeit(lambda: [ops.mm(xs[k], w, ty) for ty, w, k in ws], 1.0)
    flop = sum(2 * rows * w.shape[0] * k for _, w, k in ws)
    out = subprocess.run(
        [
            llama_bench,
            "-m",
            gguf_path,
            "-p",
            str(rows),
            "-n",
            "0",
            "-t",
            str(torch.get_num_threads()),
            "-r",
            "3",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    theirs = json.loads(out)[0]["avg_ts"]
    r = dict(
        gguf=gguf_path,
        rows=rows,
        ours_tok_s=rows / ours,
        ours_gflops=flop / ours / 1e9,
        llama_bench_tok_s=theirs,
        llama_bench_gflops=flop * theirs / rows / 1e9,
        ratio=rows / ours / theirs,
    )
    print(
        f"vs llama-bench pp{rows}: ours {r['ours_tok_s']:.1f} tok/s ({r['ours_gflops']:.1f} GFLOP/s, matmuls "
        f"only), llama.cpp {theirs:.1f} tok/s ({r['llama_bench_gflops']:.1f}): {r['ratio']:.2f}x"
    )
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(quant.SUPPORTED))
    ap.add_argument("--prefill-rows", type=int, default=512)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "ggml_types.json"))
    ap.add_argument("--llama-bench", help="path of llama-bench, to compare on --gguf")
    ap.add_argument("--gguf", help="a GGUF model (e.g. Q4_K) for the llama-bench comparison")
    args = ap.parse_args()
    ops = quant.ggml_gemv()
    if ops is None:
        sys.exit("radixrt_cpu did not build here")
    rng = np.random.default_rng(0)
    load0 = os.getloadavg()[0]
    roof = read_gbps()
    print(f"threads {torch.get_num_threads()}, read roofline {roof:.1f} GB/s, load {load0:.2f}")
    rows, mp = [], args.prefill_rows
    fp32_gflops = {}
    for k, n in SHAPES:
        x, wf = torch.randn(mp, k), torch.randn(n, k)
        fp32_gflops[(k, n)] = 2 * mp * n * k / timeit(lambda: x @ wf.T, 0.5) / 1e9
    for name in args.types.split(","):
        t = quant.BY_NAME[name]
        for k, n in SHAPES:
            w = random_blocks(t, n, k, rng)
            x1, xp = torch.randn(1, k), torch.randn(mp, k)
            # decode reads weights from DRAM (a model's weights do not fit the caches): cycle over copies
            copies = [w] + [w.clone() for _ in range(CACHE_BYTES // w.numel())]
            it = iter(range(1 << 62))
            s1 = timeit(lambda: ops.mm(x1, copies[next(it) % len(copies)], t.ggml_type), 0.3, 2 * len(copies))
            sp = timeit(lambda: ops.mm(xp, w, t.ggml_type), 0.5)
            gbps = w.numel() / s1 / 1e9
            gflops = 2 * mp * n * k / sp / 1e9
            r = dict(
                type=name,
                K=k,
                N=n,
                m1_us=s1 * 1e6,
                m1_gbps=gbps,
                m1_of_roofline=gbps / roof,
                prefill_rows=mp,
                prefill_ms=sp * 1e3,
                prefill_gflops=gflops,
                prefill_vs_fp32_matmul=gflops / fp32_gflops[(k, n)],
            )
            rows.append(r)
            print(
                f"{name:5s} K={k:5d} N={n:5d}  M=1 {s1 * 1e6:8.1f} us {gbps:6.1f} GB/s ({gbps / roof:5.1%} of "
                f"roofline)  M={mp} {sp * 1e3:7.1f} ms {gflops:6.1f} GFLOP/s "
                f"({gflops / fp32_gflops[(k, n)]:.2f}x fp32 matmul {fp32_gflops[(k, n)]:.0f})"
            )
    vs = vs_llama_bench(ops, args.gguf, args.llama_bench, mp) if args.llama_bench and args.gguf else None
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            dict(
                threads=torch.get_num_threads(),
                read_gbps=roof,
                load_start=load0,
                load_end=os.getloadavg()[0],
                vs_llama_bench=vs,
                results=rows,
                fp32_matmul_gflops={f"{k}x{n}": v for (k, n), v in fp32_gflops.items()},
            ),
            f,
            indent=1,
        )
    print(f"load at the end {os.getloadavg()[0]:.2f}; wrote", args.out)


if __name__ == "__main__":
    main()
