"""Speculative decoding on vs off (issue 27), in-process Engines, greedy, ratios from one run.

    cpuslot --all python benchmarks/bench_spec.py [--algos suffix,ngram] [--max-new 48]

Workloads (default SmolLM2-135M GGUF, its own Q4_1 blocks):
    agent-dependent  1 agent, 4 dependent tool calls on a ~700-word tool list: each call's prompt holds the
                     previous calls and their observations (the output of call i is in the prompt of i+1)
    json-decode      benchmarks/workloads.py json_decode prompts with PERSON_SCHEMA, one at a time
    random-text      prompts of random words, batch 1 (nothing to copy)
    16-concurrent    16 agent prompts at once
Per workload and setting: output tok/s (output tokens / wall seconds), and for speculation the acceptance
rate and mean accepted length (tokens per verifying request-step). Engines run the workloads alternately.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import workloads as W  # noqa: E402
from radixrt import Engine  # noqa: E402
from radixrt.runtime.models.loader import load_tokenizer  # noqa: E402

VERBS = ["search", "read", "write", "list", "delete", "move", "run", "query", "fetch", "update"]
NOUNS = ["file", "table", "issue", "branch", "test", "ticket", "user", "record", "commit", "page"]


def tool_list(rng: random.Random) -> str:
    lines = []
    for v in VERBS:
        for n in NOUNS[:5]:
            lines.append(f"- {v}_{n}(path: string, limit: integer): {v}s the {n} at path; returns JSON with "
                         f"fields status, {n}_id and content. Use it when the user asks to {v} a {n}.")
    return "\n".join(lines)


def agent_prompt(tools: str, history: list[tuple[str, str]], task: str) -> str:
    msgs = [("system", "You are an agent. Call one tool per turn as JSON "
             '{"tool": NAME, "args": {...}}.\nTools:\n' + tools), ("user", task)]
    for call, obs in history:
        msgs += [("assistant", call), ("user", "Observation: " + obs)]
    return W.chatml(msgs)


def agent_dependent(e: Engine, tools: str, max_new: int) -> int:
    hist, n = [], 0
    for i in range(4):
        out = e.generate(agent_prompt(tools, hist, "Fix the failing test in src/app/main.py."),
                         {"temperature": 0, "max_new_tokens": max_new})
        n += len(out["output_ids"])
        hist.append((out["text"], json.dumps({"status": "ok", "file_id": i, "content": "def main(): return 1/0"})))
    return n


def concurrent(e: Engine, prompts: list[str], sp: dict) -> int:
    outs: list = [None] * len(prompts)

    def one(i: int) -> None:
        outs[i] = e.generate(prompts[i], sp)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(len(o["output_ids"]) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="suffix,ngram")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-batch", type=int, default=8, help="--speculative-max-batch-size of the spec engines")
    a = ap.parse_args()
    tok, rng = load_tokenizer(), random.Random(0)
    tools = tool_list(rng)
    words = W.Words(tok)
    json_prompts = [next(p).prompt for p in W.json_decode(words, W.Sizes(json_requests=4), True).make_programs()]
    rand = [" ".join(rng.choice(VERBS + NOUNS + ["alpha", "blue", "seven", "river", "glass"]) for _ in range(40))
            for _ in range(2)]
    agents16 = [agent_prompt(tools, [], f"Task {i}: update the record {i} and run its tests.") for i in range(16)]
    g = {"temperature": 0, "max_new_tokens": a.max_new}
    wl = {
        "agent-dependent": lambda e: agent_dependent(e, tools, a.max_new),
        "json-decode": lambda e: sum(len(e.generate(p, {**g, "json_schema": json.dumps(W.PERSON_SCHEMA)})["output_ids"])
                                     for p in json_prompts),
        "random-text-b1": lambda e: sum(len(e.generate(p, {**g, "ignore_eos": True})["output_ids"]) for p in rand),
        "16-concurrent": lambda e: concurrent(e, agents16, g),
    }
    names = ["none"] + a.algos.split(",")
    engines = {n: Engine(speculative_algorithm=n, speculative_max_batch_size=a.max_batch, max_total_tokens=32768)
               for n in names}
    for e in engines.values():  # warm-up: grammar compile, first allocations
        e.generate(json_prompts[0], {**g, "max_new_tokens": 4, "json_schema": json.dumps(W.PERSON_SCHEMA)})
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at start")
    for w, fn in wl.items():
        tps = {}
        for n, e in engines.items():
            e.flush_cache()
            s0 = e.get_server_info()["cache"]["speculative"]
            t0 = time.perf_counter()
            toks = fn(e)
            dt = time.perf_counter() - t0
            s1 = e.get_server_info()["cache"]["speculative"]
            tps[n] = toks / dt
            d, acc = s1["draft_tokens"] - s0["draft_tokens"], s1["accepted_tokens"] - s0["accepted_tokens"]
            steps, emit = s1["verify_steps"] - s0["verify_steps"], s1["emitted_tokens"] - s0["emitted_tokens"]
            extra = (f"  accept_rate {acc / d:.2f} accept_length {emit / steps:.2f}" if steps else "")
            print(f"{w:16s} {n:7s} {toks:5d} tok {dt:6.2f} s {tps[n]:7.1f} tok/s  x{tps[n] / tps['none']:.2f}{extra}",
                  flush=True)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at end")
    for e in engines.values():
        e.shutdown()


if __name__ == "__main__":
    main()
