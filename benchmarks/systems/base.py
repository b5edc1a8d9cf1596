"""What every compared system shares: the :class:`System` interface, :class:`HTTPSystem` (each program an
asyncio task against a server), and the helpers that make every system send the same tokens and score
``select`` the same way (:func:`prompt_ids`, :func:`select_boundaries`, :func:`decide`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncIterator, Optional

import httpx

from metrics import Record
from workloads import Gen, Select, Workload

now = time.perf_counter


def common_prefix(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


def select_boundaries(tok: Any, context: str, choices: list[str]) -> tuple[list[list[int]], list[int], int]:
    """Exactly what ``radixrt.lang.choices.select_by_logprobs`` sends: ``context + option`` token ids, where each
    option's scored tokens start, and the smallest such start (``logprob_start_len``)."""
    ctx = tok.encode(context, add_special_tokens=False)
    fulls = [tok.encode(context + c, add_special_tokens=False) for c in choices]
    starts = [min(common_prefix(ctx, f), len(f) - 1) for f in fulls]
    return fulls, starts, min(starts)


def decide(choices: list[str], input_lps: list[list]) -> str:
    """``token_length_normalized`` (rt.select's default) on ``[[logprob, token_id], ...]`` per option."""
    from radixrt.lang.choices import token_length_normalized

    normalized = [sum(t[0] for t in lps) / len(lps) for lps in input_lps]
    return token_length_normalized(
        choices=choices,
        normalized_prompt_logprobs=normalized,
        input_token_logprobs=input_lps,
        output_token_logprobs=[[] for _ in choices],
    ).decision


def prompt_ids(tok: Any, call: Gen, eos_ids: set) -> list[int]:
    """The token ids of ``call.prompt``. A continuation (``call.cont``) reuses the ids the previous call sent and
    generated, as the model saw them (re-tokenizing its answer could split it differently), then the suffix."""
    prev = call.cont[0] if call.cont else None
    if prev is None or prev.sent_ids is None or prev.output_ids is None:
        return tok.encode(call.prompt, add_special_tokens=False)
    suffix = call.cont[1]
    base = prev.sent_ids + prev.output_ids
    if base and base[-1] in eos_ids:  # it stopped on EOS: the text has it in the suffix, or not at all
        eos_text = tok.decode([base[-1]])
        if suffix.startswith(eos_text):
            suffix = suffix[len(eos_text) :]
        else:
            base = base[:-1]
    return base + tok.encode(suffix, add_special_tokens=False)


def eos_ids_of(tok: Any) -> set:
    from radixrt.runtime.models.loader import load_config

    try:
        e = load_config().eos_token_id
    except Exception:
        e = None
    ids = set(e if isinstance(e, list) else [e]) if e is not None else set()
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return ids


def call_key(call: Any) -> tuple:
    if isinstance(call, Select):
        return ("select",)
    return ("gen", call.ignore_eos, json.dumps(call.json_schema, sort_keys=True))


def gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def choices_grammar(choices: list[str]) -> str:
    """The GBNF grammar ``root ::= " opt1" | " opt2" | ...``: a ``select`` as a constrained generation."""
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices)


def finish_grammar_select(rec: Record, call: Select, text: str) -> None:
    """``rec`` of a ``select`` run as a generation under :func:`choices_grammar`: the option ``text`` is (or
    the first one it starts, or that starts it). Its TTFT is its latency, as on every system."""
    rec.kind, rec.label = "select", call.label
    rec.decision = next((c for c in call.choices if text == c), None) or next(
        (c for c in call.choices if text.startswith(c) or c.startswith(text)), text
    )
    rec.output_text = text
    rec.t_first, rec.chunk_times = None, []


class System:
    name = "system"
    has_cache_report = False

    def unavailable(self) -> Optional[str]:
        """Why this system cannot run here, or None."""
        return None

    def describe(self) -> dict:
        return {}

    def start(self, context_length: int) -> None: ...

    def stop(self) -> None: ...

    def configure(self, in_flight: int) -> None:
        """Called before each workload's :meth:`reset` with the most programs it keeps in flight."""

    def reset(self) -> bool:
        """A cold cache before each workload; True when that took a fresh process (warm it up again)."""
        return False

    def warmup(self) -> None: ...

    def run(self, wl: Workload, programs: list, pbar: Any, concurrency: int = 0) -> list[Record]:
        raise NotImplementedError


# ---- HTTP servers: every program is an asyncio task ---------------------------------------------------------


class HTTPSystem(System):
    url = ""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    async def call(self, client: httpx.AsyncClient, call: Any, rec: Record) -> None:
        raise NotImplementedError

    def run(self, wl: Workload, programs: list, pbar: Any, concurrency: int = 0) -> list[Record]:
        return asyncio.run(self._run(wl, programs, pbar, concurrency))

    async def _run(self, wl: Workload, programs: list, pbar: Any, concurrency: int) -> list[Record]:
        out: list[Record] = []
        sem = asyncio.Semaphore(concurrency or max(len(programs), 1))
        limits = httpx.Limits(max_connections=len(programs) + 8, max_keepalive_connections=len(programs) + 8)
        async with httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(None), trust_env=False, limits=limits
        ) as client:

            async def drive(pid: int, prog: Any) -> None:
                async with sem:
                    try:
                        call = next(prog)
                    except StopIteration:
                        return
                    step = 0
                    while True:
                        rec = Record(wl.name, self.name, pid, step, call.kind, t_send=0.0, t_end=0.0)
                        rec.call = call  # type: ignore[attr-defined]
                        try:
                            await self.call(client, call, rec)
                        except Exception as e:  # a failed call ends its program; the run goes on
                            rec.error = f"{type(e).__name__}: {e}"
                            rec.t_end = now()
                        out.append(rec)
                        pbar.update(1)
                        if rec.error is not None:
                            prog.close()
                            return
                        step += 1
                        try:
                            call = prog.send(rec)
                        except StopIteration:
                            return

            await asyncio.gather(*(drive(i, p) for i, p in enumerate(programs)))
        return out

    def warmup(self) -> None:
        async def go():
            async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(None), trust_env=False) as c:
                # a short call, then a prefill of ~300 tokens: a server's first prefill of a few hundred rows
                # ran 2x slower than later ones (radixrt: 0.90 s vs 0.42 s for 213 tokens), a cost the first
                # workload measured would pay alone (json-decode ran at 0.80x of json-decode-free for it)
                for prompt, n in (("Hello, how are you today?", 8), ("Hello, how are you today? " * 45, 2)):
                    rec = Record("warmup", self.name, 0, 0, "gen", 0.0, 0.0)
                    await self.call(c, Gen(prompt, n), rec)
                    if rec.error:
                        raise RuntimeError(f"{self.name} warm-up failed: {rec.error}")

        asyncio.run(go())


class RestartedServer(HTTPSystem):
    """A server without a cache flush: :meth:`reset` restarts it (about a second), which gives every workload
    a cold cache (and a server started with what :meth:`configure` chose)."""

    proc: Any = None  # a process.Server
    context_length = 2048

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            p.stop()

    def reset(self) -> bool:
        self.stop()
        self.start(self.context_length)
        return True


async def sse_lines(resp: httpx.Response):
    """The ``data:`` payloads of an SSE response (comments and pings skipped), up to ``[DONE]``."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data


async def stream_json(client: httpx.AsyncClient, path: str, body: dict) -> AsyncIterator[tuple[float, dict]]:
    """``POST path`` streamed: ``(arrival time, chunk)`` per SSE chunk. Raises RuntimeError on an HTTP error
    status or a chunk that carries ``error``."""
    async with client.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        async for data in sse_lines(resp):
            t = now()
            d = json.loads(data)
            if "error" in d:
                raise RuntimeError(f"stream error: {d['error']}")
            yield t, d
