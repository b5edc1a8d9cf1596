"""Where ``make peers`` puts llama.cpp's binaries, and ``llama-bench``'s batch-1 decode figure.

``benchmarks/build_peers.sh`` builds ``llama-server`` and ``llama-bench`` from the llama.cpp that the
llama-cpp-python sdist vendors, into ``$RADIXRT_PEERS_DIR/llama.cpp-<version>/bin`` (default
``~/.cache/radixrt/peers``). Both benchmarks (``run_all.py``, ``bench_engine.py``) look them up here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Optional

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist whose vendored llama.cpp build_peers.sh builds


def peers_dir() -> Path:
    return Path(os.environ.get("RADIXRT_PEERS_DIR") or Path.home() / ".cache" / "radixrt" / "peers")


def llama_binary(name: str) -> Optional[str]:
    """The path of ``llama-server`` or ``llama-bench`` built by ``make peers``, or None when not built."""
    p = peers_dir() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / name
    return str(p) if p.is_file() and os.access(p, os.X_OK) else None


def missing_notice(name: str) -> str:
    return (
        f"{name} is not built: run `flock /tmp/bench.lock nice -n 10 make peers` (about 10 min on 2 cores; "
        f"it builds llama.cpp from the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist into {peers_dir()})"
    )


def llama_bench_tg(gguf: str, threads: int, n_gen: int = 128, reps: int = 3, timeout: float = 600) -> dict:
    """llama.cpp's batch-1 decode: ``llama-bench -p 0 -n n_gen`` (token generation only, one sequence).

    Returns ``{"tok_s": mean tokens/s, "stdev": tokens/s, "n_gen": tokens, "threads": n, "build": commit}``.

    Raises:
        FileNotFoundError: llama-bench is not built (``make peers``).
        RuntimeError: llama-bench failed or printed no result.
    """
    exe = llama_binary("llama-bench")
    if exe is None:
        raise FileNotFoundError(missing_notice("llama-bench"))
    cmd = [exe, "-m", gguf, "-t", str(threads), "-p", "0", "-n", str(n_gen), "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench exited with {r.returncode}: {r.stderr[-2000:]}")
    rows = [row for row in json.loads(r.stdout) if row.get("n_gen") == n_gen and row.get("n_prompt") == 0]
    if not rows:
        raise RuntimeError(f"llama-bench printed no tg{n_gen} result: {r.stdout[-2000:]}")
    row = rows[0]
    return {
        "tok_s": float(row["avg_ts"]),
        "stdev": float(row.get("stddev_ts", 0.0)),
        "n_gen": n_gen,
        "threads": int(row.get("n_threads", threads)),
        "build": row.get("build_commit"),
    }
