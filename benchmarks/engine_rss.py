"""Peak RSS of the in-process ``Engine`` on GGUF files (or safetensors directories), against issue 26's bound.

Per file, in a fresh subprocess: ``Engine(model=FILE, quantization="auto", max_total_tokens=KV)``, one
64-token prompt decoded for 16 greedy tokens (so the peak includes a prefill and a decode), then the
process's ``ru_maxrss`` beside the bound ``file bytes x 1.15 + KV pool bytes + 500 MB`` (MB = 10^6 bytes).
The pool's bytes are the runner's own report (``memory_stats``). One JSON line per file, appended to
``benchmarks/results/engine_rss.jsonl`` with the load average and commit.

    cpuslot python benchmarks/engine_rss.py FILE.gguf [FILE.gguf ...] [--kv-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "results", "engine_rss.jsonl")


def file_bytes(path: str) -> int:
    """A GGUF's size, or a safetensors directory's ``*.safetensors`` files together."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
    return os.path.getsize(path)


def child(path: str, kv_tokens: int) -> dict:
    """Runs in the fresh subprocess."""
    from radixrt import Engine

    t = time.perf_counter()
    e = Engine(
        model=path,
        quantization="auto",
        max_total_tokens=kv_tokens,
        context_length=min(kv_tokens, 8192),
        num_threads=2,
        log_level="warning",
    )
    load_s = time.perf_counter() - t
    ids = [1 + (i * 104729) % 40000 for i in range(64)]
    out = e.generate(input_ids=ids, sampling_params={"max_new_tokens": 16, "temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == 16
    m = e.runner.memory_stats()
    e.shutdown()
    return {
        "load_s": round(load_s, 1),
        "weight_bytes": m["weight_bytes"],
        "kv_pool_bytes": m["kv_pool_bytes"],
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--kv-tokens", type=int, default=4096)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT", json.dumps(child(a.child, a.kv_tokens)))
        return
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    for path in a.files:
        load = [round(x, 2) for x in os.getloadavg()]
        p = subprocess.run(
            [sys.executable, __file__, "--child", path, "--kv-tokens", str(a.kv_tokens)],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        rec = {
            "file": os.path.relpath(path, os.path.dirname(os.path.dirname(path))),
            "file_bytes": file_bytes(path),
            "kv_tokens": a.kv_tokens,
            "load_before": load,
            "commit": commit,
        }
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            rec["error"] = (p.stderr or p.stdout)[-1500:]
        else:
            rec.update(json.loads(line[-1][7:]))
            rec["bound_bytes"] = int(rec["file_bytes"] * 1.15 + rec["kv_pool_bytes"] + 500e6)
            rec["within"] = rec["peak_rss_bytes"] <= rec["bound_bytes"]
        with open(OUT, "a") as f:
            f.write(json.dumps(rec) + "\n")
        mib = lambda k: rec.get(k, 0) / 2**20  # noqa: E731
        print(
            f"{rec['file']}: "
            + (
                rec["error"][-300:]
                if "error" in rec
                else f"peak {mib('peak_rss_bytes'):.0f} MiB, bound {mib('bound_bytes'):.0f} MiB (weights "
                f"{mib('weight_bytes'):.0f}, KV {mib('kv_pool_bytes'):.0f}), load {rec['load_s']} s at {load[0]}"
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
