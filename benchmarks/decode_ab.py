"""radixrt vs ``llama-bench`` on one GGUF file, alternating, to tell noise from a real gap (issue 26).

One in-process ``Engine`` (``--quantization auto``, 2 threads) is loaded once; then ``--rounds`` times:
radixrt batch-1 decode (``--new-tokens`` after a 16-token prompt, as ``real_models.py measure``), then
``llama-bench -t 2 -r 1 -n N -p 0`` on the same file; with ``--prefill`` also radixrt's 512-token prefill
and ``llama-bench -p 512 -n 0``. The load average is read before each timing. Run the whole script under
``cpuslot --all`` (the Engine is idle while llama-bench runs: its pool workers sleep after 200 us).
Appends one JSON line per file to ``benchmarks/results/decode_ab.jsonl``.

    cpuslot --all python benchmarks/decode_ab.py ~/.cache/radixrt/models/llama-3.2-1b/llama-3.2-1b-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

from real_models import SHORT, decode_tok_s, long_prompt, prefill_tok_s, sp

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.expanduser("~/.cache/radixrt/peers/llama.cpp-0.3.36/bin/llama-bench")
OUT = os.path.join(HERE, "results", "decode_ab.jsonl")


def llama(path: str, pp: int, tg: int) -> float:
    out = subprocess.run(
        [BENCH, "-m", path, "-t", "2", "-r", "1", "-p", str(pp), "-n", str(tg), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)[0]["avg_ts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    from radixrt import Engine

    t = time.perf_counter()
    e = Engine(
        model=a.gguf,
        quantization="auto",
        speculative_algorithm="none",
        max_total_tokens=2048,
        context_length=2048,
        num_threads=2,
        log_level="warning",
    )
    load_s = time.perf_counter() - t
    long = long_prompt(512)
    e.generate(input_ids=SHORT, sampling_params=sp(8))  # warm-up
    e.generate(input_ids=long[:64], sampling_params=sp(1))
    rec = {"file": os.path.basename(a.gguf), "load_s": load_s, "rounds": []}
    for _ in range(a.rounds):
        r = {"load": os.getloadavg()[0]}
        r["radixrt_tg"] = decode_tok_s(e, a.new_tokens)
        if not a.no_llama:
            r["llama_tg"] = llama(a.gguf, 0, a.new_tokens)
        if a.prefill:
            r["radixrt_pp"] = prefill_tok_s(e, long)
            if not a.no_llama:
                r["llama_pp"] = llama(a.gguf, 512, 0)
        rec["rounds"].append(r)
        print(json.dumps(r), flush=True)
    e.shutdown()
    for k in ("tg", "pp"):
        xs = [r[f"radixrt_{k}"] for r in rec["rounds"] if f"radixrt_{k}" in r]
        ys = [r[f"llama_{k}"] for r in rec["rounds"] if f"llama_{k}" in r]
        if xs:
            rec[f"radixrt_{k}_median"] = statistics.median(xs)
        if xs and ys:
            rec[f"llama_{k}_median"] = statistics.median(ys)
            rec[f"{k}_ratio"] = statistics.median(xs) / statistics.median(ys)
    rec["commit"] = subprocess.run(
        ["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(rec["file"], {k: round(v, 3) for k, v in rec.items() if k.endswith(("median", "ratio"))}, flush=True)
    with open(OUT, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
