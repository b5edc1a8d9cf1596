"""Speculative decoding on vs off (issue 27), in-process Engines, greedy, ratios from one run.

    cpuslot --all python benchmarks/bench_spec.py [--algos suffix,ngram] [--max-new 48] [--workloads a,b]
                                                  [--warm-system]

Workloads (default SmolLM2-135M GGUF, its own Q4_1 blocks); every call greedy:
    agent-dependent  1 agent, 4 dependent tool calls on a ~700-word tool list: each call's prompt holds the
                     previous calls and their observations (the output of call i is in the prompt of i+1)
    agent-loop       benchmarks/workloads.py agent_loop: 2 agents x 4 dependent JSON tool calls (TOOL_SCHEMA),
                     one agent at a time
    json-decode      benchmarks/workloads.py json_decode prompts with PERSON_SCHEMA, one at a time
    multi-turn-chat  benchmarks/workloads.py multi_turn_chat: 2 conversations x 4 turns, 48-token replies
    random-text-b1   prompts of random words, batch 1 (nothing to copy)
    16-concurrent    16 agent prompts at once
Per workload and setting: ``out tok/s`` = output tokens / wall seconds of the workload (prefill included;
the issue's "output tok/s"), and for the one-at-a-time workloads ``decode tok/s`` = (output tokens - 1 per
call) / the calls' seconds after their first token (the decode phase alone). For speculation: the
acceptance rate and mean accepted length (tokens per verifying request-step). Engines run each workload in
turn; ``--repeat N`` runs it N times per engine (alternating): the line shows each engine's fastest run, and
the ratios of the medians over the N runs (``median out`` / ``decode``).
``--warm-system`` prefills the workload's shared system message (the tool list of agent-dependent and 16-concurrent,
agent-loop's notes, json-decode's instructions, the chat's system line) before each timed run, as every request
after a fleet's first finds it, with the drafter's store still empty. agent-loop and multi-turn-chat send token
ids: each call continues from the previous call's ids and answer as generated (``systems/base.prompt_ids``, as
the suite's radixrt system does), not from the re-tokenized text.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import workloads as W  # noqa: E402
from systems.base import eos_ids_of, prompt_ids  # noqa: E402
from radixrt import Engine  # noqa: E402
from radixrt.runtime.models.loader import load_tokenizer  # noqa: E402

VERBS = ["search", "read", "write", "list", "delete", "move", "run", "query", "fetch", "update"]
NOUNS = ["file", "table", "issue", "branch", "test", "ticket", "user", "record", "commit", "page"]


def tool_list(rng: random.Random) -> str:
    lines = []
    for v in VERBS:
        for n in NOUNS[:5]:
            lines.append(
                f"- {v}_{n}(path: string, limit: integer): {v}s the {n} at path; returns JSON with "
                f"fields status, {n}_id and content. Use it when the user asks to {v} a {n}."
            )
    return "\n".join(lines)


def agent_prompt(tools: str, history: list[tuple[str, str]], task: str) -> str:
    msgs = [
        ("system", 'You are an agent. Call one tool per turn as JSON {"tool": NAME, "args": {...}}.\nTools:\n' + tools),
        ("user", task),
    ]
    for call, obs in history:
        msgs += [("assistant", call), ("user", "Observation: " + obs)]
    return W.chatml(msgs)


def agent_dependent(e: Engine, tools: str, max_new: int) -> list[dict]:
    hist, outs = [], []
    for i in range(4):
        out = e.generate(
            agent_prompt(tools, hist, "Fix the failing test in src/app/main.py."),
            {"temperature": 0, "max_new_tokens": max_new},
        )
        outs.append(out)
        hist.append((out["text"], json.dumps({"status": "ok", "file_id": i, "content": "def main(): return 1/0"})))
    return outs


def concurrent(e: Engine, prompts: list[str], sp: dict) -> list[dict]:
    outs: list = [None] * len(prompts)

    def one(i: int) -> None:
        outs[i] = e.generate(prompts[i], sp)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return outs


def run_programs(e: Engine, programs, tok, eos: set) -> list[dict]:
    """Drive workloads.py programs one after another (each call's answer feeds the next prompt). A call that
    continues the previous one sends its token ids as ``systems/base.prompt_ids`` builds them for the suite's
    radixrt system: the previous ids and answer as generated, then the new turn (re-tokenizing the answer can
    split it otherwise, and the KV of everything after the split would be computed again)."""
    outs = []
    for prog in programs:
        try:
            call = next(prog)
            while True:
                sp = {"temperature": 0, "max_new_tokens": call.max_new_tokens, "ignore_eos": call.ignore_eos}
                if call.json_schema is not None:
                    sp["json_schema"] = json.dumps(call.json_schema)
                ids = prompt_ids(tok, call, eos)
                o = e.generate(input_ids=ids, sampling_params=sp)
                outs.append(o)
                call = prog.send(SimpleNamespace(output_text=o["text"], sent_ids=ids, output_ids=o["output_ids"]))
        except StopIteration:
            pass
    return outs


def workloads(tok, a) -> tuple[dict, dict]:
    """The workloads by name, and each one's shared system message (for ``--warm-system``)."""
    rng = random.Random(0)
    tools = tool_list(rng)
    words = W.Words(tok)
    z = W.Sizes(json_requests=4, agent_programs=2, chat_convs=2, chat_reply_len=48)
    json_prompts = [next(p).prompt for p in W.json_decode(words, z, True).make_programs()]
    rand = [
        " ".join(rng.choice(VERBS + NOUNS + ["alpha", "blue", "seven", "river", "glass"]) for _ in range(40))
        for _ in range(4)
    ]
    agents16 = [agent_prompt(tools, [], f"Task {i}: update the record {i} and run its tests.") for i in range(16)]
    g = {"temperature": 0, "max_new_tokens": a.max_new}
    js = json.dumps(W.PERSON_SCHEMA)
    eos = eos_ids_of(tok)
    return {
        "agent-dependent": lambda e: agent_dependent(e, tools, a.max_new),
        "agent-loop": lambda e: run_programs(e, W.agent_loop(words, z).make_programs(), tok, eos),
        "json-decode": lambda e: [e.generate(p, {**g, "json_schema": js}) for p in json_prompts],
        "multi-turn-chat": lambda e: run_programs(e, W.multi_turn_chat(words, z).make_programs(), tok, eos),
        "random-text-b1": lambda e: [e.generate(p, {**g, "ignore_eos": True}) for p in rand],
        "16-concurrent": lambda e: concurrent(e, agents16, g),
    }, {
        "agent-dependent": system_prefix(tools),
        "agent-loop": system_turn(next(W.agent_loop(words, z).make_programs()[0]).prompt),
        "json-decode": system_turn(json_prompts[0]),
        "multi-turn-chat": system_turn(next(W.multi_turn_chat(words, z).make_programs()[0]).prompt),
        "16-concurrent": system_prefix(tools),
    }


def system_prefix(tools: str) -> str:
    """The agents' shared system message alone (a token prefix of every agent prompt: ChatML's turns end in
    ``<|im_end|>\n``), for ``--warm-system``."""
    return W.chatml(
        [
            (
                "system",
                'You are an agent. Call one tool per turn as JSON {"tool": NAME, "args": {...}}.\nTools:\n' + tools,
            )
        ]
    )


def system_turn(prompt: str) -> str:
    """A ChatML prompt's first turn, its system message (a token prefix of the prompt, as above)."""
    return prompt[: prompt.index("<|im_end|>\n") + len("<|im_end|>\n")]


def measure(e: Engine, fn, warm: str | None = None) -> dict:
    e.flush_cache()
    if warm:  # a fleet's steady state: the tool list already prefilled, the drafter's store still empty
        e.generate(warm, {"temperature": 0, "max_new_tokens": 1, "speculative": False})
    s0 = e.get_server_info()["cache"]["speculative"]
    t0 = time.perf_counter()
    outs = fn(e)
    dt = time.perf_counter() - t0
    s1 = e.get_server_info()["cache"]["speculative"]
    toks = sum(len(o["output_ids"]) for o in outs)
    decode_s = sum(o["meta_info"]["e2e_latency"] - (o["meta_info"]["ttft"] or 0) for o in outs)
    d = {k: s1[k] - s0[k] for k in ("draft_tokens", "accepted_tokens", "verify_steps", "emitted_tokens")}
    return {
        "tokens": toks,
        "seconds": dt,
        "tps": toks / dt,
        "decode_tps": (toks - len(outs)) / decode_s if decode_s > 0 else 0.0,
        **d,
    }


def median(ms: list[dict], key: str) -> float:
    return statistics.median(m[key] for m in ms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="suffix")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-batch", type=int, default=0, help="--speculative-max-batch-size (0: the cost model)")
    ap.add_argument("--workloads", default="")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-adaptive", action="store_true", help="--no-speculative-adaptive for the spec engines")
    ap.add_argument(
        "--warm-system",
        action="store_true",
        help="prefill the workload's shared system message before each timed run, as every request "
        "after a fleet's first finds it; the drafter's store stays empty (1 token out, speculation off)",
    )
    a = ap.parse_args()
    tok = load_tokenizer()
    wl, systems = workloads(tok, a)
    if a.workloads:
        wl = {k: wl[k] for k in a.workloads.split(",")}
    names = ["none"] + a.algos.split(",")
    engines = {
        n: Engine(
            speculative_algorithm=n,
            speculative_max_batch_size=a.max_batch,
            max_total_tokens=32768,
            speculative_adaptive=not a.no_adaptive,
        )
        for n in names
    }
    js = json.dumps(W.PERSON_SCHEMA)
    for e in engines.values():  # warm-up: grammar compile, first allocations
        e.generate("Warm up.", {"temperature": 0, "max_new_tokens": 4, "json_schema": js})
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at start")
    for w, fn in wl.items():
        runs: dict = {n: [] for n in engines}
        for _ in range(a.repeat):
            for n, e in engines.items():
                runs[n].append(measure(e, fn, systems.get(w) if a.warm_system else None))
        best = {n: min(ms, key=lambda m: m["seconds"]) for n, ms in runs.items()}
        for n, m in best.items():
            extra = (
                f"  accept_rate {m['accepted_tokens'] / m['draft_tokens']:.2f} accept_length "
                f"{m['emitted_tokens'] / m['verify_steps']:.2f}"
                if m["verify_steps"]
                else ""
            )
            print(
                f"{w:16s} {n:7s} {m['tokens']:5d} tok {m['seconds']:6.2f} s  out {m['tps']:6.1f} tok/s "
                f"x{m['tps'] / best['none']['tps']:.2f}  decode {m['decode_tps']:6.1f} tok/s "
                f"x{m['decode_tps'] / best['none']['decode_tps']:.2f}  median out "
                f"x{median(runs[n], 'tps') / median(runs['none'], 'tps'):.2f} decode "
                f"x{median(runs[n], 'decode_tps') / median(runs['none'], 'decode_tps'):.2f}{extra}",
                flush=True,
            )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at end")
    for e in engines.values():
        e.shutdown()


if __name__ == "__main__":
    main()
