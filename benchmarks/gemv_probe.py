"""Batch-1 products of a GGUF file's weights alone: where a decode step's matmul time goes (issue 26).

Every 2-D weight a decode step multiplies (the ``blk.*`` projections in file order, then ``output`` or the
tied ``token_embd``) runs once through ``radixrt_ggml.mm`` at ``--rows`` activation rows, in that order,
``--reps`` times: the sum is the step's matmul time from memory (the file is larger than the last-level
cache), printed as a tok/s bound beside weight GB/s per type and shape. ``--hot`` also times each shape
repeated on one tensor (in cache where it fits): near the cold figure means the kernel, not memory, limits.
The machine's read bandwidth (``roofline.read_gbps``) is measured in the same run.

    cpuslot --all python benchmarks/gemv_probe.py ~/.cache/radixrt/models/llama-3.2-1b/llama-3.2-1b-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import read_gbps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hot", action="store_true")
    ap.add_argument(
        "--layout",
        choices=["x16", "gguf"],
        default="x16",
        help="x16: each weight the runtime repacks (Q4_K, Q5_K, Q6_K, Q8_0, rows % 16 == 0) in its x16 layout, as "
        "the runtime runs it (default); gguf: every weight in the file's own blocks (RADIXRT_GGML_X16=0)",
    )
    a = ap.parse_args()
    from gguf import GGUFReader

    from radixrt.kernels import cpp
    from radixrt.kernels.quant import TYPES, x16

    torch.set_num_threads(2)
    ops = cpp.ops("radixrt_ggml")
    r = GGUFReader(a.gguf)
    names = {t.name for t in r.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    ws = []
    for t in r.tensors:
        if len(t.shape) == 2 and (t.name.startswith("blk.") or t.name == head):
            ty = int(t.tensor_type)
            if ty not in TYPES:
                continue
            w = torch.from_numpy(np.asarray(t.data)).reshape(int(t.shape[1]), -1)
            if a.layout == "x16" and x16.can_repack(TYPES[ty].name, w.shape[0]):
                w, ty = x16.repack(w, TYPES[ty].name), ty | x16.X16
            ws.append((t.name, ty, w, int(t.shape[0])))
    xs = {k: torch.randn(a.rows, k) for _, _, _, k in ws}

    def kind(ty: int) -> str:
        return TYPES[ty & ~x16.X16].name + ("x16" if ty & x16.X16 else "")

    per = collections.defaultdict(float)
    for _, ty, w, k in ws:  # warm-up: page the file in
        ops.mm(xs[k], w, ty)
    total = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for name, ty, w, k in ws:
            t = time.perf_counter()
            ops.mm(xs[k], w, ty)
            per[(kind(ty), tuple(w.shape))] += time.perf_counter() - t
        total.append(time.perf_counter() - t0)
    nbytes = collections.Counter()
    count = collections.Counter()
    for _, ty, w, _ in ws:
        nbytes[(kind(ty), tuple(w.shape))] += w.numel()
        count[(kind(ty), tuple(w.shape))] += 1
    probe = read_gbps()
    allb = sum(w.numel() for _, _, w, _ in ws)
    best = min(total)
    print(
        f"{os.path.basename(a.gguf)} ({a.layout}) M={a.rows}: matmuls {best * 1e3:.2f} ms/step (median "
        f"{sorted(total)[len(total) // 2] * 1e3:.2f}), {allb / best / 1e9:.1f} GB/s, bound {1 / best:.1f} tok/s; "
        f"read probe {probe:.1f} GB/s; load {os.getloadavg()[0]:.2f}"
    )
    for key in sorted(per, key=lambda k: -per[k]):
        s = per[key] / a.reps
        gbs = nbytes[key] / s / 1e9
        line = f"  {key[0]:8s} {str(key[1]):16s} x{count[key]:3d}: {s * 1e3:7.2f} ms/step {gbs:6.1f} GB/s"
        if a.hot:
            name, ty, w, k = next(x for x in ws if (kind(x[1]), tuple(x[2].shape)) == key)
            for _ in range(3):
                ops.mm(xs[k], w, ty)
            n = 20
            t = time.perf_counter()
            for _ in range(n):
                ops.mm(xs[k], w, ty)
            h = (time.perf_counter() - t) / n
            line += f"   hot {w.numel() / h / 1e9:6.1f} GB/s ({w.numel() / 2**20:.1f} MB)"
        print(line)


if __name__ == "__main__":
    main()
