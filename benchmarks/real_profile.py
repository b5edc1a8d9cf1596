"""Where a batch-1 decode step (or a 512-token prefill) of a real-size GGUF spends its time: torch profiler.

One in-process ``Engine`` (``--quantization auto``, 2 threads), a warm-up, then one profiled greedy request:
``--mode decode`` is a 16-token prompt and ``--new-tokens`` tokens (the 16-token prefill is in it too, a
small share), ``--mode prefill`` one 512-token prompt for 1 token. Prints the wall time per step, the ops by
self CPU time summed over every thread (``profile_all_threads``: the scheduler runs in its own thread), and
for each weight matmul op its input shapes, so a slow type (say Q6_K's ``ffn_down`` or the head) shows up by
its shape. Writes ``benchmarks/results/real_profile_<file>_<mode>.txt``.

    cpuslot --all python benchmarks/real_profile.py ~/.cache/radixrt/models/llama-3.2-1b/llama-3.2-1b-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args()
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    from radixrt import Engine

    e = Engine(
        model=a.gguf,
        quantization="auto",
        speculative_algorithm="none",
        max_total_tokens=2048,
        context_length=2048,
        num_threads=2,
        log_level="warning",
    )
    sp = lambda n: {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}  # noqa: E731
    short = [1 + (i * 7919) % 40000 for i in range(16)]
    long = [1 + (i * 104729) % 40000 for i in range(512)]
    ids, n = (short, a.new_tokens) if a.mode == "decode" else (long, 1)
    e.generate(input_ids=ids[:64], sampling_params=sp(4))  # warm-up
    e.flush_cache()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    ) as prof:
        t = time.perf_counter()
        e.generate(input_ids=ids, sampling_params=sp(n))
        wall = time.perf_counter() - t
    e.shutdown()
    load = os.getloadavg()
    commit = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    head = (
        f"{os.path.basename(a.gguf)} {a.mode}: {wall:.2f} s for {n} tokens "
        f"({wall / n * 1e3:.1f} ms/token), commit {commit}, load {load[0]:.2f}, torch {torch.__version__}"
    )
    by_op = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows)
    by_shape = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=a.rows)
    text = "\n".join([head, "", "by op (self CPU, all threads):", by_op, "", "by op and input shapes:", by_shape])
    print(text)
    out = os.path.join(HERE, "results", f"real_profile_{os.path.basename(a.gguf)[:-5]}_{a.mode}.txt")
    with open(out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
