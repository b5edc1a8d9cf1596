"""Grammar backends on real-world JSON schemas: compiled, invalid finished outputs, compile ms, mask us (issue 29).

Corpora: tests/data/jsonschema/dev (120) and benchmarks/data/jsonschemabench_sample.jsonl (300, see
make_schema_set.py). Per backend and schema: compile (timed; a compile error is a refusal), then ``--walks``
seeded random walks through the mask (``radixrt.runtime.constrained.sample_walk``: no model), each
finished output validated with ``jsonschema``. Each backend runs in a worker process so that a schema
whose compile exceeds ``--timeout`` seconds (outlines-core's index on large schemas) is cut off and
counted as a timeout.

    python benchmarks/bench_schemas.py [--backends llguidance,xgrammar,outlines] [--walks 3]
        [--out benchmarks/results/grammar_backends.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
ROOT = Path(__file__).resolve().parent
DEV = ROOT.parent / "tests" / "data" / "jsonschema" / "dev"  # the 120 schemas the tests use


def corpora() -> dict[str, list[tuple[str, str]]]:
    """``corpus -> [(case id, schema text)]``."""
    dev = [(p.stem, p.read_text()) for p in sorted(DEV.glob("*.json"))]
    sample = []
    for line in (ROOT / "data" / "jsonschemabench_sample.jsonl").read_text().splitlines():
        d = json.loads(line)
        sample.append((f"{d['subset']}__{d['name']}", json.dumps(d["schema"], ensure_ascii=False)))
    return {"dev": dev, "jsonschemabench_sample": sample}


def _worker(backend: str, walks: int, max_tokens: int, conn) -> None:
    import random

    from radixrt.runtime.constrained import create_backend
    from radixrt.runtime.constrained.sample_walk import closer_ids, random_walk, schema_violation
    from radixrt.runtime.models.loader import load_config, load_tokenizer

    tok = load_tokenizer()
    vocab = load_config().vocab_size
    be = create_backend(backend, tok, vocab)
    closers = closer_ids(tok)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        case, text = msg
        out = {
            "case": case,
            "compiled": False,
            "error": None,
            "compile_ms": None,
            "finished": 0,
            "invalid": [],
            "mask_us": [],
        }
        t0 = time.perf_counter()
        try:
            compiled = be.compile("json_schema", text)
        except ValueError as e:
            out["error"] = str(e)[:300]
            conn.send(out)
            continue
        out["compile_ms"] = (time.perf_counter() - t0) * 1e3
        out["compiled"] = True
        schema = json.loads(text)
        for i in range(walks):
            w = random_walk(compiled, tok, vocab, be.eos_token_id, random.Random(f"{case}/{i}"), closers, max_tokens)
            out["mask_us"] += w.mask_us
            if w.finished:
                out["finished"] += 1
                why = schema_violation(w.text, schema)
                if why:
                    out["invalid"].append({"walk": i, "text": w.text[:300], "why": why})
        conn.send(out)


def run_backend(backend: str, cases: list[tuple[str, str]], walks: int, max_tokens: int, timeout: float) -> list:
    ctx = mp.get_context("spawn")
    results, proc, conn = [], None, None

    def start():
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(backend, walks, max_tokens, b), daemon=True)
        p.start()
        assert a.recv() == "ready"
        return p, a

    for case, text in cases:
        if proc is None:
            proc, conn = start()
        conn.send((case, text))
        if conn.poll(timeout):
            results.append(conn.recv())
        else:
            proc.kill()
            proc.join()
            proc = None
            results.append(
                {
                    "case": case,
                    "compiled": False,
                    "error": f"timeout ({timeout:.0f} s)",
                    "timeout": True,
                    "finished": 0,
                    "invalid": [],
                    "mask_us": [],
                    "compile_ms": None,
                }
            )
    if proc is not None:
        conn.send(None)
        proc.join(10)
    return results


def summarize(results: list) -> dict:
    masks = sorted(x for r in results for x in r["mask_us"])
    comp = [r["compile_ms"] for r in results if r["compiled"]]
    return {
        "schemas": len(results),
        "compiled": len(comp),
        "timeouts": sum(1 for r in results if r.get("timeout")),
        "finished": sum(r["finished"] for r in results),
        "invalid": sum(len(r["invalid"]) for r in results),
        "invalid_schemas": sorted(r["case"] for r in results if r["invalid"]),
        "compile_ms_mean": statistics.fmean(comp) if comp else None,
        "compile_ms_p50": statistics.median(comp) if comp else None,
        "mask_us_mean": statistics.fmean(masks) if masks else None,
        "mask_us_p99": masks[int(0.99 * (len(masks) - 1))] if masks else None,
        "masks": len(masks),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="llguidance,xgrammar,outlines")
    ap.add_argument("--corpora", default="dev,jsonschemabench_sample")
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per schema (compile + walks)")
    ap.add_argument("--out", default=str(ROOT / "results" / "grammar_backends.json"))
    a = ap.parse_args()
    data = corpora()
    report = json.loads(Path(a.out).read_text()) if os.path.exists(a.out) else {}
    for backend in a.backends.split(","):
        for name in a.corpora.split(","):
            t0 = time.time()
            res = run_backend(backend, data[name], a.walks, a.max_tokens, a.timeout)
            s = summarize(res)
            s["wall_s"] = round(time.time() - t0, 1)
            s["refused"] = [f"{r['case']}: {r['error']}" for r in res if r["error"]]
            s["invalid_outputs"] = [dict(case=r["case"], **x) for r in res for x in r["invalid"]]
            report.setdefault(backend, {})[name] = s
            print(
                f"{backend:10s} {name:24s} compiled {s['compiled']}/{s['schemas']} (timeouts {s['timeouts']}) "
                f"finished {s['finished']} invalid {s['invalid']} compile {s['compile_ms_mean'] or 0:.0f} ms mean "
                f"mask {s['mask_us_mean'] or 0:.0f} us mean / {s['mask_us_p99'] or 0:.0f} us p99 ({s['wall_s']} s)",
                flush=True,
            )
            Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
