"""Grammar-constrained decoding cost (issue 5).

Prints, with a realistic tool-call schema (``tool_choice: "required"`` over three tools, as the server
builds it):

- decode tok/s at batch 1 and 32, constrained vs unconstrained, in one run. The unconstrained run does the
  same work: the same prompts, each with ``max_new_tokens`` = its constrained output length and
  ``ignore_eos``, so the batch shrinks the same way. Target: constrained >= 0.9x unconstrained;
- where the per-token cost goes: ``fill_next_token_bitmask`` per row (Python loop over the rows, as in the
  scheduler) and ``apply_token_bitmask_`` on the batch's logits;
- compile time, cold (a fresh backend) and cached (``GrammarCache`` hit), for the schema and for the
  ``auto`` structural tag.

    python benchmarks/bench_grammar.py [--batch-sizes 1,32] [--out benchmarks/results/bench_grammar.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.constrained import (
    GrammarCache,
    allocate_token_bitmask,
    apply_token_bitmask_,  # noqa: E402
    create_backend,
    validate_spec,
)
from radixrt.runtime.server.openai.tool_parser import plan_tools  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Search flights between two airports",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                    "passengers": {
                        "type": "object",
                        "properties": {
                            "adults": {"type": "integer", "minimum": 1, "maximum": 9},
                            "children": {"type": "integer", "minimum": 0, "maximum": 9},
                        },
                        "required": ["adults"],
                    },
                    "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]},
                },
                "required": ["origin", "destination", "date", "passengers"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_event",
            "description": "Create a calendar event",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 80},
                    "start": {"type": "string", "maxLength": 30},
                    "duration_minutes": {"type": "integer", "minimum": 5},
                    "attendees": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 8},
                    "reminder": {"type": "boolean"},
                },
                "required": ["title", "start"],
            },
        },
    },
]
QUESTIONS = [
    "What's the weather in Paris this week?",
    "Find me a flight from SFO to JFK on 2025-03-14 for 2 adults.",
    "Schedule a meeting called 'Roadmap review' tomorrow at 10am with Ana and Bo.",
    "Is it going to rain in Tokyo?",
    "Book business class from LHR to CDG next Friday.",
    "Remind me to call mom at 6pm.",
    "How cold is it in Oslo in fahrenheit?",
    "Plan a one hour lunch with the team on Monday.",
]


def chat_prompt(tok, plan, question: str) -> str:
    msgs = plan.inject([{"role": "user", "content": question}])
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def run(engine, prompts, sps):
    """(outputs, decode tok/s): tokens after each request's first, over the time after the last first token."""
    t0 = time.perf_counter()
    outs = engine.generate(prompts, sps)
    end = time.perf_counter()
    first = max(o["meta_info"]["ttft"] for o in outs) + t0
    tokens = sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    return outs, tokens / max(end - first, 1e-9)


def mask_costs(engine, kind: str, spec: str, outs, batch: int) -> dict:
    """Replay the constrained outputs through fresh matchers: per-row fill time and per-batch apply time."""
    compiled = engine.grammar_cache.get(kind, spec)
    seqs = [o["output_ids"] for o in outs][:batch]
    matchers = [compiled.matcher() for _ in seqs]
    vocab = engine.runner.vocab_size
    fills, applies, accepts, steps = [], [], [], max(len(s) for s in seqs)
    logits = torch.randn(len(seqs), vocab)
    for step in range(steps):
        live = [i for i, s in enumerate(seqs) if step < len(s)]
        mask = allocate_token_bitmask(len(live), vocab)
        t = time.perf_counter()
        for j, i in enumerate(live):
            matchers[i].fill_next_token_bitmask(mask, j)
        fills.append((time.perf_counter() - t) / len(live))
        t = time.perf_counter()  # as the scheduler does: gather the grammar rows, mask, scatter back
        sub = logits[live]
        apply_token_bitmask_(sub, mask)
        logits[live] = sub
        applies.append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in live:
            matchers[i].accept_token(seqs[i][step])
        accepts.append((time.perf_counter() - t) / len(live))
    return {
        "fill_us_per_row": 1e6 * statistics.mean(fills),
        "accept_us_per_row": 1e6 * statistics.mean(accepts),
        "apply_ms_per_step": 1e3 * statistics.mean(applies),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/bench_grammar.json")
    args = ap.parse_args()
    engine = Engine(max_total_tokens=32768, max_running_requests=64)
    tok = engine.tokenizer
    plan = plan_tools(TOOLS, "required", None)
    kind, spec = plan.grammar()
    spec = validate_spec(kind, spec)
    auto = plan_tools(TOOLS, "auto", None)
    akind, aspec = auto.grammar()
    aspec = validate_spec(akind, aspec)
    results: dict = {
        "schema_chars": len(spec),
        "grammar_backend": engine.grammar_cache.backend.name,
        "threads": torch.get_num_threads(),
    }

    # compile: cold (fresh backend, so no cache anywhere) and cached (GrammarCache hit)
    cold_backend = create_backend("xgrammar", tok, engine.runner.vocab_size)
    for name, (k, s) in (("tool_schema", (kind, spec)), ("auto_structural_tag", (akind, aspec))):
        t = time.perf_counter()
        cold_backend.compile(k, s)
        cold = time.perf_counter() - t
        cache = GrammarCache(cold_backend)
        cache.get(k, s)
        t = time.perf_counter()
        cache.get(k, s)
        cached = time.perf_counter() - t
        cache.shutdown()
        results[f"compile_{name}"] = {"cold_ms": 1e3 * cold, "cached_ms": 1e3 * cached}
        print(f"compile {name:20s} cold {1e3 * cold:9.1f} ms   cached {1e3 * cached:8.3f} ms")
    engine.grammar_check(kind, spec)  # the engine's own cache, so the decode runs measure decoding only

    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = [chat_prompt(tok, plan, QUESTIONS[i % len(QUESTIONS)] + f" (request {i})") for i in range(bs)]
        engine.generate(prompts[:1], {"max_new_tokens": 2, "temperature": 0})  # warm up
        con_sps = [{"json_schema": spec, "temperature": 0, "max_new_tokens": args.max_new_tokens} for _ in prompts]
        outs, con_tps = run(engine, prompts, con_sps)
        lens = [o["meta_info"]["completion_tokens"] for o in outs]
        stops = sum(o["meta_info"]["finish_reason"]["type"] == "stop" for o in outs)
        free_sps = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in lens]
        engine.flush_cache()
        _, free_tps = run(engine, prompts, free_sps)
        engine.flush_cache()
        outs, con_tps2 = run(engine, prompts, con_sps)  # constrained again: interleave to damp noise
        engine.flush_cache()
        _, free_tps2 = run(engine, prompts, free_sps)
        con, free = (con_tps + con_tps2) / 2, (free_tps + free_tps2) / 2
        costs = mask_costs(engine, kind, spec, outs, bs)
        step_ms = 1e3 * bs / free if free else float("nan")
        overhead_ms = (costs["fill_us_per_row"] + costs["accept_us_per_row"]) * bs / 1e3 + costs["apply_ms_per_step"]
        results[f"batch_{bs}"] = {
            "constrained_tps": con,
            "unconstrained_tps": free,
            "ratio": con / free,
            "mean_len": statistics.mean(lens),
            "finished_by_grammar": stops,
            **costs,
            "unconstrained_step_ms": step_ms,
            "mask_overhead_ms_per_step": overhead_ms,
        }
        print(
            f"batch {bs:3d}: decode constrained {con:8.1f} tok/s   unconstrained {free:8.1f} tok/s   "
            f"ratio {con / free:5.2f}x (target >= 0.90)   mean output {statistics.mean(lens):.0f} tokens, "
            f"{stops}/{bs} ended by the grammar"
        )
        print(
            f"           grammar per step: fill {costs['fill_us_per_row']:.1f} us/row, accept "
            f"{costs['accept_us_per_row']:.1f} us/row, apply {costs['apply_ms_per_step']:.2f} ms/batch -> "
            f"{overhead_ms:.2f} ms of a {step_ms:.1f} ms step ({100 * overhead_ms / step_ms:.1f}%)"
        )
    sample = engine.generate(
        chat_prompt(tok, plan, QUESTIONS[1]),
        {"json_schema": spec, "temperature": 0, "max_new_tokens": args.max_new_tokens},
    )
    print("sample constrained output:", sample["text"][:200])
    engine.shutdown()
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
