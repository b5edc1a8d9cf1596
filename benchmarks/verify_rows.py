"""The cost of a speculative verification row in the C++ attention kernel: one layer's attention over
``--context`` cached tokens (SmolLM2's GQA: 9 query heads on 3 KV heads, head_dim 64, fp32 pool) for a row of
T tokens, against a decode row of 1, on one thread (a ratio that does not move with the other core's load).
A row of 9 does 9x one row's arithmetic, but a lone row fills 3 of 8 lanes of the score products and all
27 queries of a KV head share each K/V read: spec6 (2026-12-04) measured t9/t1 = 3.2x, 5.3-5.8x before the
register blocks stayed in registers.

    cpuslot --all python benchmarks/verify_rows.py [--context 2300] [--rows 9] [--reps 25]
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=2300, help="cached tokens before the row")
    ap.add_argument("--rows", type=int, default=9, help="tokens of the verification row (k drafts + 1)")
    ap.add_argument("--reps", type=int, default=25, help="interleaved runs; the fastest of each is kept")
    a = ap.parse_args()
    import time

    from radixrt.kernels.attention.base import write_kv
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.kernels.attention.torch_native import TorchNativeBackend
    from radixrt.runtime.mem.kv_pool import KVPool

    hq, hkv, d, p = 9, 3, 64, 16
    torch.set_num_threads(1)
    pages = -(-(a.context + a.rows) // p)
    pool = KVPool(pages, p, 1, hkv, d, torch.float32)
    g = torch.Generator().manual_seed(2)
    n = pages * p
    write_kv(pool, 0, torch.arange(n), torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g))
    best = {1: float("inf"), a.rows: float("inf")}
    args = {t: [torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv)] for t in best}
    plans = {t: TorchNativeBackend("cpu", kernel=True) for t in best}
    for t, be in plans.items():
        be.plan(AttentionMetadata.build([list(range(pages))], [t], [a.context + t], p))
    for _ in range(a.reps):
        for t, be in plans.items():
            t0 = time.perf_counter()
            be.forward(*args[t], 0, pool, d**-0.5)
            best[t] = min(best[t], time.perf_counter() - t0)
    print(
        f"context {a.context}: t1 {best[1] * 1e6:.0f} us, t{a.rows} {best[a.rows] * 1e6:.0f} us, "
        f"t{a.rows}/t1 = {best[a.rows] / best[1]:.2f}x"
    )


if __name__ == "__main__":
    main()
