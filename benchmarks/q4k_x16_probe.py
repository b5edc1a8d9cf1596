"""Would a 16-row interleaved Q4_K layout multiplied with vpdpbusd beat today's mid-row AVX-512 tiles (issue 44)?
Builds ``native/q4k_x16_probe.cpp`` with the kernels' own flags (``radixrt/kernels/cpp.py`` FLAGS, without
OpenMP) and runs it: per activation row count M, both kernels' time for one product on 2 threads (weight copies
cycled, so from memory), GMAC/s, and each one's largest error against an fp64 reference.

    flock /tmp/bench.lock python benchmarks/q4k_x16_probe.py            # 8192 x 2048, the 1B MLP's up/gate
    flock /tmp/bench.lock python benchmarks/q4k_x16_probe.py --n 2048 --k 8192   # its down projection

Needs AVX-512 VNNI (the probe has no AVX2 twin; it changes nothing in the runtime).
"""

from __future__ import annotations

import argparse
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SRC = os.path.join(HERE, "native", "q4k_x16_probe.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-std=c++17", "-pthread"]


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--n", type=int, default=8192, help="output columns (weight rows), a multiple of 16")
    ap.add_argument("--k", type=int, default=2048, help="input width, a multiple of 256")
    ap.add_argument("--copies", type=int, default=8, help="weight copies cycled (more than the LLC holds)")
    ap.add_argument("--reps", type=int, default=40, help="products per timing (fewer than ~20 give noise)")
    a = ap.parse_args()
    if a.n <= 0 or a.n % 16:
        raise SystemExit(f"--n must be a positive multiple of 16, got {a.n}")
    if a.k <= 0 or a.k % 256:
        raise SystemExit(f"--k must be a positive multiple of 256, got {a.k}")
    if a.copies < 1 or a.reps < 1:
        raise SystemExit(f"--copies and --reps must be at least 1, got {a.copies} and {a.reps}")
    with open("/proc/cpuinfo") as f:
        if " avx512_vnni" not in f.read():
            raise SystemExit("q4k_x16_probe: this CPU has no AVX-512 VNNI")
    exe = os.path.expanduser("~/.cache/radixrt/native/q4k_x16_probe")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    inc = os.path.join(ROOT, "radixrt", "kernels", "quant")
    subprocess.run(["g++", *FLAGS, "-I", inc, SRC, "-o", exe], check=True)
    need = a.copies * a.n * (a.k // 256) * (144 + 2368 // 16)  # GGUF blocks + their x16 repack
    if need > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2:
        raise SystemExit(
            f"--n {a.n} --k {a.k} --copies {a.copies} needs ~{need / 1e9:.1f} GB of weights: too large here"
        )
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    subprocess.run([exe, str(a.n), str(a.k), str(a.copies), str(a.reps)], check=True)


if __name__ == "__main__":
    main()
