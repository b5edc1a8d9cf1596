"""Request traces for comparing eviction policies, replayed through the radix tree without the model.

- ``agent_churn``: agents that share a system prompt and grow their own history call after call (call k's
  prompt = call k-1's prompt + its answer + a tool observation), with ``churn`` one-off requests between two
  calls of the same agent (unique prompts; half of them share a short chat preamble). This is the pattern
  where LRU evicts an agent's history while its tool runs.
- ``phase_shift``: groups of requests sharing a system prompt, where the set of hot prompts changes halfway
  (a new tenant mix, a new deployment of prompts). Counts that never decay keep the old prompts cached.
- ``suite``: the benchmark suite's five workloads (``workloads.py``), tokenized with the model's tokenizer.
  Model outputs are stood in by seeded words of the call's length (JSON-shaped for the JSON calls), so the
  prompt structure and every length are the suite's. Programs advance round-robin: every program's call k
  before any program's call k+1, as they run concurrently live.
"""

from __future__ import annotations

import json
import random
from typing import Any

from radixrt.runtime.profile.replay import ReplayReq

VOCAB = (100, 40000)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def agent_churn(
    agents: int = 8,
    calls: int = 6,
    churn: int = 4,
    system_len: int = 1024,
    task_len: int = 64,
    answer_len: int = 48,
    obs_len: int = 160,
    oneoff_len: int = 768,
    oneoff_out: int = 64,
    seed: int = 0,
) -> list[ReplayReq]:
    """``agents`` x ``calls`` agent calls, round-robin over agents, ``churn`` one-offs before each call."""
    rng = random.Random(f"agent-churn-{seed}")
    system, chat = _ids(rng, system_len), _ids(rng, 128)
    hist = [system + _ids(rng, task_len) for _ in range(agents)]
    out: list[ReplayReq] = []
    for _ in range(calls):
        for a in range(agents):
            for _ in range(churn):
                pre = chat if rng.random() < 0.5 else []
                p = pre + _ids(rng, oneoff_len - len(pre))
                out.append(ReplayReq(len(p), oneoff_out, p + _ids(rng, oneoff_out)))
            ans = _ids(rng, answer_len)
            out.append(ReplayReq(len(hist[a]), answer_len, hist[a] + ans))
            hist[a] = hist[a] + ans + _ids(rng, obs_len)
    return out


def phase_shift(
    groups: int = 6,
    per_phase: int = 240,
    system_len: int = 768,
    question_len: int = 96,
    out_len: int = 32,
    oneoff_every: int = 2,
    seed: int = 0,
) -> list[ReplayReq]:
    """Two phases of ``per_phase`` requests over ``groups`` system prompts each (different prompts in the
    second phase); every ``oneoff_every``-th request is a one-off of the same length instead."""
    rng = random.Random(f"phase-shift-{seed}")
    out: list[ReplayReq] = []
    for _ in range(2):
        systems = [_ids(rng, system_len) for _ in range(groups)]
        for i in range(per_phase):
            head = _ids(rng, system_len) if i % oneoff_every == 0 else rng.choice(systems)
            p = head + _ids(rng, question_len)
            out.append(ReplayReq(len(p), out_len, p + _ids(rng, out_len)))
    return out


class _FakeRecord:
    """What a program reads back from a call: the answer's text and ids."""

    def __init__(self, sent_ids: list[int], output_ids: list[int], text: str):
        self.sent_ids, self.output_ids, self.output_text = sent_ids, output_ids, text
        self.finish_reason = "length"


def _answer(call: Any, words: Any, tok: Any, rng: random.Random) -> tuple[list[int], str]:
    """Stand-in output: JSON of the call's schema when it has one, else ``max_new_tokens`` words."""
    if call.json_schema is not None:
        props = list(call.json_schema.get("properties", {}))
        obj = {k: (rng.randrange(18, 90) if k == "age" else words.text(rng, 2).strip()) for k in props}
        text = json.dumps(obj)
        return tok.encode(text, add_special_tokens=False)[: call.max_new_tokens], text
    text = words.text(rng, call.max_new_tokens)
    return tok.encode(text, add_special_tokens=False)[: call.max_new_tokens], text


def suite(tok: Any, names: tuple[str, ...] | None = None, seed: int = 0) -> dict[str, list[ReplayReq]]:
    """One trace per workload of the benchmark suite at its default sizes (json-decode-free is the same
    prompts as json-decode, so it is left out)."""
    import workloads as W
    from systems.base import prompt_ids, select_boundaries

    words = W.Words(tok)
    z = W.sizes_from("default", {"seed": seed})
    out: dict[str, list[ReplayReq]] = {}
    for wl in W.build(list(names or W.WORKLOADS), words, z):
        if wl.match_from is not None:
            continue
        rng = random.Random(f"{seed}-{wl.name}-answers")
        progs = wl.make_programs()
        pending = [next(p, None) for p in progs]
        reqs: list[ReplayReq] = []
        while any(c is not None for c in pending):
            for i, call in enumerate(pending):
                if call is None:
                    continue
                if call.kind == "select":
                    fulls, _, start = select_boundaries(tok, call.context, call.choices)
                    reqs += [ReplayReq(len(f), 0, f, cacheable=start - 1) for f in fulls]
                    rec = _FakeRecord([], [], "")
                else:
                    sent = prompt_ids(tok, call, set())
                    ids, text = _answer(call, words, tok, rng)
                    reqs.append(ReplayReq(len(sent), len(ids), sent + ids))
                    rec = _FakeRecord(sent, ids, text)
                try:
                    pending[i] = progs[i].send(rec)
                except StopIteration:
                    pending[i] = None
        out[wl.name] = reqs
    return out
