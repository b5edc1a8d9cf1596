"""The x16 tiles outside torch (issue 44): per type and activation row count M, one product on 2 threads with
the weight from memory (``--copies`` cycled), on each instruction set the CPU has: AVX-512 VNNI, AMX (from 2
rows) and AVX2; ms, GMAC/s and GB/s of weight, and the bits of every path compared with each other and with a
scalar reading of ``x16_layout.h``'s arithmetic straight from the GGUF blocks. Builds ``native/x16_bench.cpp``
with the kernels' own flags (``radixrt/kernels/cpp.py`` FLAGS, without OpenMP) and the runtime's headers.

    flock /tmp/bench.lock python benchmarks/x16_bench.py                        # every type, 8192 x 2048
    flock /tmp/bench.lock python benchmarks/x16_bench.py --types Q4_K --n 2048 --k 8192   # a down projection
    flock /tmp/bench.lock python benchmarks/x16_bench.py --types Q4_0,Q4_1,Q5_0,Q5_1     # the legacy types

Exits 1 if any path's bits differ. The in-runtime comparison with the file's own blocks is ``gemv_probe.py
--layout x16|gguf`` and ``RADIXRT_GGML_X16=0|1 step_curve.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(HERE, "native", "x16_bench.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-std=c++17", "-pthread"]
TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--types", default="all", help=f"comma list of {TYPES}, or all")
    ap.add_argument("--n", type=int, default=8192, help="output columns (weight rows), a multiple of 16")
    ap.add_argument("--k", type=int, default=2048, help="input width, a multiple of 256")
    ap.add_argument("--copies", type=int, default=8, help="weight copies cycled (more than the LLC holds)")
    ap.add_argument("--reps", type=int, default=20, help="products per timing (fewer give noise)")
    a = ap.parse_args()
    types = TYPES if a.types == "all" else tuple(a.types.split(","))
    for t in types:
        if t not in TYPES:
            raise SystemExit(f"--types: {t!r} is not one of {TYPES}")
    if a.n <= 0 or a.n % 16:
        raise SystemExit(f"--n must be a positive multiple of 16, got {a.n}")
    if a.k <= 0 or a.k % 256:
        raise SystemExit(f"--k must be a positive multiple of 256, got {a.k}")
    if a.copies < 1 or a.reps < 1:
        raise SystemExit(f"--copies and --reps must be at least 1, got {a.copies} and {a.reps}")
    need = 2 * a.copies * a.n * a.k * 210 // 256  # the GGUF blocks and their repack, at the largest type
    if need > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2:
        raise SystemExit(f"--n {a.n} --k {a.k} --copies {a.copies} needs ~{need / 1e9:.1f} GB: too large here")
    exe = os.path.expanduser("~/.cache/radixrt/native/x16_bench")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    inc = os.path.join(ROOT, "radixrt", "kernels", "quant")
    subprocess.run(["g++", *FLAGS, "-I", inc, SRC, "-o", exe], check=True)
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    rc = 0
    for t in types:
        rc |= subprocess.run([exe, t, str(a.n), str(a.k), str(a.copies), str(a.reps)]).returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
