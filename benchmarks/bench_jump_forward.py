"""Jump-forward decoding on vs off on the json-decode workload (issue 15, part 2; issue 27: the forced
tokens as drafts in the multi-token decode row), in-process Engine.

    flock /tmp/bench.lock python benchmarks/bench_jump_forward.py [--requests 16] [--repeat N]

Settings: ``off`` (no jump-forward, no speculation), ``extend`` (jump-forward: the forced text appended as an
extend chunk), ``drafts`` (speculation ``suffix``, jump-forward off: the grammar's forced tokens and the
drafter's are verified inside the decode row). Per setting: the workload's requests (PERSON_SCHEMA
extractions, greedy) all submitted at once, then forward passes per request (one per step a request takes
part in), output tokens per request, output tok/s (output tokens / wall seconds), jump-forward tokens,
forced draft tokens kept, and the share of schema-valid outputs. Prints one line per setting and run, and
the ratios to ``off`` of the medians over ``--repeat`` alternating runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import jsonschema  # noqa: E402

import workloads as W  # noqa: E402
from radixrt import Engine  # noqa: E402
from radixrt.runtime.models.loader import load_tokenizer  # noqa: E402


def prompts(n: int) -> list[str]:
    tok = load_tokenizer()
    z = W.Sizes(json_requests=n)
    wl = W.json_decode(W.Words(tok), z, True)
    return [next(p).prompt for p in wl.make_programs()]


SETTINGS = {
    "off": dict(speculative_algorithm="none", disable_jump_forward=True),
    "extend": dict(speculative_algorithm="none", disable_jump_forward=False),
    "drafts": dict(speculative_algorithm="suffix", disable_jump_forward=True),
}


def run(setting: str, ps: list[str], max_new: int) -> dict:
    e = Engine(max_total_tokens=16384, **SETTINGS[setting])
    try:
        sp = {"max_new_tokens": max_new, "temperature": 0, "json_schema": json.dumps(W.PERSON_SCHEMA)}
        e.generate(ps[0], sp)  # warm-up: grammar compile, first-step allocations
        e.flush_cache()
        c0 = e.get_server_info()["cache"]
        outs: list = [None] * len(ps)

        def one(i: int) -> None:
            outs[i] = e.generate(ps[i], sp)

        t0 = time.perf_counter()
        th = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        c1 = e.get_server_info()["cache"]
    finally:
        e.shutdown()
    toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
    valid = 0
    for o in outs:
        try:
            jsonschema.validate(json.loads(o["text"]), W.PERSON_SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    n = len(ps)
    return {
        "setting": setting,
        "requests": n,
        "forward_passes_per_request": (c1["req_forward_passes"] - c0["req_forward_passes"]) / n,
        "output_tokens_per_request": toks / n,
        "output_tok_per_s": toks / wall,
        "wall_s": wall,
        "jump_forward_tokens": c1["jump_forward_tokens"] - c0["jump_forward_tokens"],
        "forced_accepted": c1["speculative"]["forced_accepted_tokens"] - c0["speculative"]["forced_accepted_tokens"],
        "schema_valid": f"{valid}/{n}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--on-first", action="store_true", help="run jump-forward on before off (order check)")
    ap.add_argument("--repeat", type=int, default=1, help="alternating runs per setting (ratios of the medians)")
    a = ap.parse_args()
    ps = prompts(a.requests)
    order = ["extend", "off", "drafts"] if a.on_first else ["off", "extend", "drafts"]
    res: dict = {s: [] for s in order}
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at start")
    for _ in range(a.repeat):
        for s in order:
            res[s].append(run(s, ps, a.max_new_tokens))
            print(
                json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res[s][-1].items()}), flush=True
            )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at end")
    med = {
        s: {k: statistics.median(r[k] for r in rs) for k in ("forward_passes_per_request", "output_tok_per_s")}
        for s, rs in res.items()
    }
    for s in ("extend", "drafts"):
        print(
            f"{s} / off: forward passes per request {med[s]['forward_passes_per_request']:.1f} vs "
            f"{med['off']['forward_passes_per_request']:.1f} "
            f"({med[s]['forward_passes_per_request'] / med['off']['forward_passes_per_request']:.2f}x), output tok/s "
            f"{med[s]['output_tok_per_s']:.1f} vs {med['off']['output_tok_per_s']:.1f} "
            f"({med[s]['output_tok_per_s'] / med['off']['output_tok_per_s']:.2f}x)"
        )


if __name__ == "__main__":
    main()
