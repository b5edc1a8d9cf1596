"""The box's compute roofline for the multi-row GGUF products (issue 44): int8 multiply-adds per second on 1 and
2 threads for each instruction form the kernels use, operands in registers (``native/int8_peak.cpp``), beside
the memory read bandwidth (``roofline.read_gbps``), measured in the same run.

    flock /tmp/bench.lock python benchmarks/int8_peak.py

A step of T rows through a model of P multiply-adds per token needs T * P MACs: at this peak, the fastest it can
run is T * P / peak seconds, whatever the tiling (``--macs`` prints that bound for a given T * P).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from roofline import read_gbps  # noqa: E402

SRC = os.path.join(HERE, "native", "int8_peak.cpp")
# form -> (multiply-adds per loop iteration, needs AVX-512 VNNI)
FORMS = {
    "avx2_maddubs": (8 * 32, False),
    "vnni256": (8 * 32, True),
    "kq512": (8 * 64, True),
    "vnni512": (8 * 64, True),
    "fma512": (8 * 16, True),
    "amx": (4 * 16 * 16 * 64, True),  # needs AMX-TILE/INT8 too (checked below)
}


def build() -> ctypes.CDLL:
    """Compile ``native/int8_peak.cpp`` (g++ -O3) into ~/.cache/radixrt/native and load it."""
    out = os.path.expanduser("~/.cache/radixrt/native/int8_peak.so")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(SRC):
        subprocess.run(["g++", "-O3", "-std=c++17", "-shared", "-fPIC", SRC, "-o", out], check=True)
    lib = ctypes.CDLL(out)
    for name in FORMS:
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_int64]
    return lib


def has_vnni512() -> bool:
    with open("/proc/cpuinfo") as f:
        return " avx512_vnni" in f.read()


def has_amx() -> bool:
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return " amx_int8" in flags and " amx_tile" in flags


def rate(fn, macs_per_iter: int, threads: int, iters: int = 10_000_000) -> float:
    """Multiply-adds per second, in G, of ``threads`` threads each running ``fn(iters)`` at once (ctypes
    releases the GIL)."""
    fn(iters // 20)  # warm-up: clocks and the 512-bit units up
    ts = [threading.Thread(target=fn, args=(iters,)) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return macs_per_iter * iters * threads / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--macs", type=float, default=0.0, help="multiply-adds of one step: print its time bound")
    a = ap.parse_args()
    if not math.isfinite(a.macs) or a.macs < 0:
        raise SystemExit(f"--macs must be a finite number >= 0 (multiply-adds of one step), got {a.macs}")
    lib = build()
    vnni = has_vnni512()
    print(f"load {os.getloadavg()[0]:.2f}, read bandwidth {read_gbps():.1f} GB/s")
    for name, (per, need) in FORMS.items():
        if need and not vnni:
            print(f"{name:13s} not run: no AVX-512 VNNI here")
            continue
        if name == "amx" and not (has_amx() and lib.amx(1) >= 0):
            print(f"{name:13s} not run: no AMX here (or the OS does not grant its tile state)")
            continue
        iters = 200_000 if name == "amx" else 10_000_000
        g1 = rate(getattr(lib, name), per, 1, iters)
        g2 = rate(getattr(lib, name), per, 2, iters)
        unit = "GFMA/s (fp32)" if name == "fma512" else "GMAC/s (int8)"
        line = f"{name:13s} 1 thread {g1:7.1f}  2 threads {g2:7.1f} {unit}"
        if a.macs and name != "fma512":
            line += f"  -> {a.macs / (g2 * 1e9) * 1e3:.1f} ms for {a.macs:.3g} MACs"
        print(line)


if __name__ == "__main__":
    main()
