"""The step-time curve t(T) of a model: the fastest of ``--reps`` forwards of one row of T tokens, as the
speculation cost model's calibration measures it (``runtime/scheduler/spec_calibrate.py``), for each T.
Speculative verification of k draft tokens is such a row of k + 1 tokens; batch-T decode costs about the same
in weight products. Run it twice with ``RADIXRT_GGML_MID_ROWS=0`` (the many-row tiles from 3 rows) to see
what the mid-row tiles (``kernels/quant/midrows512.h``) changed.

    cpuslot --all python benchmarks/step_curve.py ~/.cache/radixrt/models/llama-3.2-1b/llama-3.2-1b-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a GGUF file or HF directory (Engine's `model`; default: SmolLM2-135M, Q4_1)",
    )
    ap.add_argument("--sizes", default="1,2,3,4,5,6,8,10,12,16,20,24,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--context",
        type=int,
        default=0,
        help="tokens already in the pool before the row (a verification row at a long context)",
    )
    a = ap.parse_args()
    from radixrt.runtime.engine import Engine
    from radixrt.runtime.scheduler.spec_calibrate import measure_step_times

    sizes = tuple(int(s) for s in a.sizes.split(","))
    with Engine(model=a.model, max_total_tokens=max(4096, 2 * (a.context + max(sizes)))) as eng:
        times = measure_step_times(
            eng.runner, eng.scheduler.allocator, sizes, reps=a.reps, context=a.context, budget_s=None
        )
    mid = os.environ.get("RADIXRT_GGML_MID_ROWS", "default")
    x16 = os.environ.get("RADIXRT_GGML_X16", "1")
    print(
        f"{os.path.basename(a.model or 'smollm2-135m')} (RADIXRT_GGML_X16={x16}, RADIXRT_GGML_MID_ROWS={mid}, "
        f"context {a.context}, "
        f"load {os.getloadavg()[0]:.2f}) ms per step:"
    )
    print("  " + "  ".join(f"t{T} {times(T) * 1e3:.1f}" for T in sizes))


if __name__ == "__main__":
    main()
