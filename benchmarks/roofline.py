"""The machine's own roofline, measured in the same run as the figures compared against it."""

from __future__ import annotations

import time

import torch


def matmul_gflops(n: int = 1024, reps: int = 20, dtype=torch.float32, device="cpu") -> float:
    """Sustained dense matmul throughput, GFLOP/s."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def read_gbps(mbytes: int = 512, reps: int = 10, device="cpu") -> float:
    """Memory read bandwidth (a full reduction over a large buffer), GB/s."""
    x = torch.ones(mbytes * 2**20 // 4, dtype=torch.float32, device=device)
    x.sum()
    t = time.perf_counter()
    for _ in range(reps):
        x.sum()
    if device != "cpu":
        torch.cuda.synchronize()
    return x.numel() * 4 * reps / (time.perf_counter() - t) / 1e9


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
