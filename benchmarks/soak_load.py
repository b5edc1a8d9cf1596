"""One round of the soak suite's load (benchmarks/soak.py): N concurrent streaming clients of a live
``radixrt serve``, loopback only.

Clients cycle through three kinds: OpenAI chat (``/v1/chat/completions``), native ``/generate``, and
``/generate`` constrained by a JSON schema; half share a long system prefix (radix-cache hits), half
have a unique one. A quarter hang up mid-stream (close the connection after a few events); one in
sixteen aborts itself with ``POST /abort_request`` after its first event. Each client ends as one of:

- ``completed``: ``[DONE]`` after a ``stop``/``length`` finish (JSON kind: valid JSON when it stopped);
- ``hung_up`` / ``aborted``: as planned (an abort must finish with reason ``abort``);
- ``refused``: an explicit 503 naming a dead child (only during a kill fault: the supervisor's answer);
- ``lost``: anything else among clients that stayed connected (no ``[DONE]``, a timeout, an unexpected
  status or error event, bad JSON). The target is 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

SYSTEM = (
    "You are a careful assistant for a railway company. Answer questions about timetables, tickets, "
    "refunds and accessibility in one or two short sentences. Never invent train numbers; when unsure, "
    "say so and point the traveller to the help desk in the main hall. "
) * 2
QUESTIONS = [
    "When does the first train leave?",
    "Can I bring a bicycle?",
    "How do I get a refund?",
    "Is there step-free access?",
    "What is a rail card?",
    "Where is the help desk?",
]
WORDS = "amber basin cedar delta ember fjord grove harbor island juniper kettle lagoon meadow nectar".split()
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "open": {"type": "boolean"}},
    "required": ["city", "open"],
}
KINDS = ("chat", "generate", "json")
CLIENT_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    kind: str
    status: str  # completed | hung_up | aborted | refused | lost
    ttft: Optional[float] = None  # seconds, request sent -> first token event
    detail: str = ""


@dataclass
class RoundResult:
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def ttfts(self) -> list[float]:
        return sorted(o.ttft for o in self.outcomes if o.ttft is not None)


def _prompt(rng: random.Random, shared: bool) -> tuple[str, str]:
    """(system, user) texts: the shared system prefix, or a unique word salad of similar length."""
    q = rng.choice(QUESTIONS)
    if shared:
        return SYSTEM, q
    return " ".join(rng.choice(WORDS) for _ in range(60)), q


def _body(kind: str, rid: str, system: str, user: str, max_tokens: int, seed: int) -> tuple[str, dict]:
    if kind == "chat":
        return "/v1/chat/completions", {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0.8,
            "seed": seed,
        }
    sp = {"max_new_tokens": max_tokens, "temperature": 0.8, "seed": seed}
    if kind == "json":
        sp = {**sp, "json_schema": json.dumps(SCHEMA), "max_new_tokens": 48}
    return "/generate", {"text": f"{system}\n{user}\n", "rid": rid, "stream": True, "sampling_params": sp}


def _has_token(kind: str, ev: dict) -> bool:
    if kind == "chat":
        return any((c.get("delta") or {}).get("content") for c in ev.get("choices", []))
    return bool(ev.get("output_ids"))


def _finish(kind: str, ev: dict) -> Optional[str]:
    if kind == "chat":
        return next((c.get("finish_reason") for c in ev.get("choices", []) if c.get("finish_reason")), None)
    fr = (ev.get("meta_info") or {}).get("finish_reason")
    return fr.get("type") if fr else None


def _refusal(body: dict, fault: bool) -> bool:
    msg = (body.get("error") or {}).get("message", "")
    return fault and "process exited unexpectedly" in msg


async def one_client(
    http: httpx.AsyncClient, kind: str, rid: str, rng: random.Random, hang_after: int, abort: bool, fault: bool
) -> Outcome:
    """One streaming client (see the module docstring); ``fault``: a kill is planned during this round."""
    system, user = _prompt(rng, rng.random() < 0.5)
    path, body = _body(kind, rid, system, user, rng.randint(16, 48), rng.randrange(1 << 30))
    t0, ttft, n, finish, text, last = time.perf_counter(), None, 0, None, "", None
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            err = json.loads(await r.aread())
            status = "refused" if r.status_code == 503 and _refusal(err, fault) else "lost"
            return Outcome(kind, status, detail=f"{r.status_code} {err}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                last = ev
                continue
            n += 1
            if ttft is None and _has_token(kind, ev):
                ttft = time.perf_counter() - t0
            finish = _finish(kind, ev) or finish
            text = (
                ev.get("text", text)
                if kind != "chat"
                else text + "".join((c.get("delta") or {}).get("content") or "" for c in ev.get("choices", []))
            )
            if hang_after and n >= hang_after:
                return Outcome(kind, "hung_up", ttft)  # leaving the block closes the connection
            if abort and n == 1:
                await http.post("/abort_request", json={"rid": rid})
        else:
            return Outcome(kind, "lost", ttft, "the stream ended without [DONE]")
    if last is not None:
        return Outcome(kind, "refused" if _refusal(last, fault) else "lost", ttft, str(last))
    if abort and finish == "abort":
        return Outcome(kind, "aborted", ttft)  # (it may also have finished before the abort came)
    if finish not in ("stop", "length"):
        return Outcome(kind, "lost", ttft, f"finish {finish}")
    if kind == "json" and finish == "stop":
        try:
            json.loads(text)
        except ValueError:
            return Outcome(kind, "lost", ttft, f"invalid JSON: {text!r}")
    return Outcome(kind, "completed", ttft)


async def run_round(
    url: str, headers: dict, concurrency: int, seed: int, fault: bool = False, timeout: float = CLIENT_TIMEOUT_S
) -> RoundResult:
    """``concurrency`` clients at once; bounded by ``timeout`` seconds (clients still open then are lost)."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    res = RoundResult()
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits) as http:
        tasks = []
        for i in range(concurrency):
            kind = KINDS[i % len(KINDS)]
            hang = rng.randint(2, 6) if i % 4 == 3 else 0
            abort = (i % 16 == 5) and kind != "chat"
            tasks.append(one_client(http, kind, f"soak-{seed}-{i}", random.Random(rng.random()), hang, abort, fault))
        done = await asyncio.gather(*(asyncio.wait_for(t, timeout) for t in tasks), return_exceptions=True)
    for i, d in enumerate(done):
        if isinstance(d, BaseException):
            d = Outcome(KINDS[i % len(KINDS)], "lost", detail=f"{type(d).__name__}: {d}")
        res.outcomes.append(d)
    res.wall_s = time.perf_counter() - t0
    return res
