"""The systems compared, all driven through one interface: ``start``, ``reset`` (a cold cache before each
workload), ``warmup``, ``run(workload, programs, pbar)`` -> records, ``stop``.

- ``radixrt``          ``radixrt serve``, native ``POST /generate`` (streamed); ``select`` is the request
                       ``rt.select`` sends (``radixrt.lang.choices``): one prefill-only request carrying every
                       ``context + option``, scored by token-length-normalized input logprobs.
- ``radixrt-nocache``  the same server with ``--disable-radix-cache`` (the ablation).
- ``hf-generate``      transformers ``generate`` in this process, static batches of ``batch_size`` programs run
                       in lockstep (left padding, greedy). JSON calls are constrained with xgrammar's HF logits
                       processor. ``select`` scores options from prompt logprobs (one forward over the contexts when
                       every option is a single appended token, else over every ``context + option``).
                       Timing: a batch's requests are sent when its ``generate`` starts; a token arrives at its
                       decoding step (a logits processor stamps each step); every request ends when ``generate``
                       returns, which is when a caller gets it.
- ``llama.cpp``        llama.cpp's ``llama-server`` built by ``make peers``: see ``llama_server.py``.
- ``llama-cpp-python`` ``python -m llama_cpp.server`` (``llama-cpp-python[server]``, the ``[peers]`` extra) on the
                       same GGUF file with its RAM prompt cache on (``--cache true``) and ``/v1/completions``
                       streamed. It serves one request at a time (requests queue in the server). JSON calls are
                       constrained by a GBNF grammar converted from the schema (``json_schema_to_gbnf``); ``select``
                       is a greedy generation under the grammar ``" opt1" | " opt2" | ...`` (its server returns
                       prompt logprobs only by sorting the whole vocabulary in Python per token, and only with
                       ``logits_all``, which also makes its prompt-cache states huge); ``ignore_eos`` is a logit
                       bias of -1e9 on the special tokens. It reports no cached tokens, so its hit rate is n/a.
                       Skipped, with a notice, when ``llama_cpp`` is not importable.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
from metrics import Record  # noqa: E402
from workloads import Gen, Select, Workload  # noqa: E402

now = time.perf_counter


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


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
    return token_length_normalized(choices=choices, normalized_prompt_logprobs=normalized,
                                   input_token_logprobs=input_lps,
                                   output_token_logprobs=[[] for _ in choices]).decision


def prompt_ids(tok: Any, call: Gen, eos_ids: set) -> list[int]:
    """The token ids of ``call.prompt``. A continuation (``call.cont``) reuses the ids the previous call sent and
    generated, as the model saw them (re-tokenizing its answer could split it differently), then the suffix."""
    prev = call.cont[0] if call.cont else None
    if prev is None or prev.sent_ids is None or prev.output_ids is None:
        return tok.encode(call.prompt, add_special_tokens=False)
    suffix = call.cont[1]
    base = prev.sent_ids + prev.output_ids
    if base and base[-1] in eos_ids:   # it stopped on EOS: the text has it in the suffix, or not at all
        eos_text = tok.decode([base[-1]])
        if suffix.startswith(eos_text):
            suffix = suffix[len(eos_text):]
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
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(None), trust_env=False,
                                     limits=limits) as client:
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
                rec = Record("warmup", self.name, 0, 0, "gen", 0.0, 0.0)
                await self.call(c, Gen("Hello, how are you today?", 8), rec)
                if rec.error:
                    raise RuntimeError(f"{self.name} warm-up failed: {rec.error}")
        asyncio.run(go())


async def sse_lines(resp: httpx.Response):
    """The ``data:`` payloads of an SSE response (comments and pings skipped), up to ``[DONE]``."""
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data


class RadixRT(HTTPSystem):
    """``radixrt serve`` (started with ``tests/server_util.ServerProc``)."""
    has_cache_report = True

    def __init__(self, tokenizer: Any, name: str = "radixrt", extra: tuple = (), max_total_tokens: int = 32768):
        super().__init__(tokenizer)
        self.name, self.extra, self.max_total_tokens = name, tuple(extra), max_total_tokens
        self.proc = None
        self.eos_ids = eos_ids_of(tokenizer)

    def describe(self) -> dict:
        quant = () if "--quantization" in self.extra else ("--quantization", "auto")
        return {"cmd": "python -m radixrt serve " + " ".join(quant + self.extra), "api": "POST /generate (stream)",
                "max_total_tokens": self.max_total_tokens}

    def start(self, context_length: int) -> None:
        from server_util import ServerProc
        # ServerProc defaults to `--quantization none` (the tests compare with HF fp32); a benchmark runs what
        # users get: `auto`, the GGUF's own q4, as llama.cpp does on the same file
        quant = () if "--quantization" in self.extra else ("--quantization", "auto")
        self.proc = ServerProc("--context-length", str(context_length), "--max-total-tokens",
                               str(self.max_total_tokens), "--log-level", "warning", *quant, *self.extra)
        self.url = self.proc.url
        try:
            self.proc.wait_ready(timeout=600)
        except Exception:
            self.proc.kill()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stop()
            except Exception as e:
                print(f"[{self.name}] stop: {e}", file=sys.stderr)
                self.proc.kill()
            self.proc = None

    def reset(self) -> bool:
        deadline = time.time() + 60
        with httpx.Client(base_url=self.url, timeout=60, trust_env=False) as c:
            while True:
                r = c.post("/flush_cache")
                if r.status_code == 200:
                    return False
                if time.time() > deadline:
                    raise RuntimeError(f"flush_cache failed: {r.status_code} {r.text}")
                time.sleep(0.2)

    def profile_pid(self) -> int:
        """The scheduler process (the model, the KV pool, the radix tree): what ``--profile`` samples."""
        return int(self.server_info()["process_ids"]["scheduler"])

    def server_info(self) -> dict:
        with httpx.Client(base_url=self.url, timeout=60, trust_env=False) as c:
            return c.get("/get_server_info").json()

    async def call(self, client: httpx.AsyncClient, call: Any, rec: Record) -> None:
        if isinstance(call, Select):
            return await self._select(client, call, rec)
        sp: dict = {"max_new_tokens": call.max_new_tokens, "temperature": 0}
        if call.ignore_eos:
            sp["ignore_eos"] = True
        if call.json_schema is not None:
            sp["json_schema"] = json.dumps(call.json_schema)
        rec.t_send = now()
        rec.sent_ids = prompt_ids(self.tok, call, self.eos_ids)   # tokenized here, as rt.select does
        body = {"input_ids": rec.sent_ids, "sampling_params": sp, "stream": True}
        last, seen = None, 0
        async with client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            async for data in sse_lines(resp):
                t = now()
                d = json.loads(data)
                if "error" in d:
                    raise RuntimeError(f"stream error: {d['error']}")
                n = len(d.get("output_ids") or ())
                if n > seen:
                    seen = n
                    rec.chunk_times.append(t)
                    if rec.t_first is None:
                        rec.t_first = t
                last = d
        rec.t_end = now()
        if last is None:
            raise RuntimeError("empty stream")
        m = last["meta_info"]
        rec.output_text = last["text"]
        rec.output_ids = list(last["output_ids"])
        rec.output_tokens = m["completion_tokens"]
        rec.reported_prompt_tokens = m["prompt_tokens"]
        rec.cached_tokens = m["cached_tokens"]
        fr = m.get("finish_reason") or {}
        rec.finish_reason = fr.get("type") if isinstance(fr, dict) else str(fr)

    async def _select(self, client: httpx.AsyncClient, call: Select, rec: Record) -> None:
        rec.t_send = now()
        fulls, starts, start = select_boundaries(self.tok, call.context, call.choices)
        body = {"input_ids": fulls, "return_logprob": True, "logprob_start_len": start,
                "sampling_params": {"max_new_tokens": 0}}
        resp = await client.post("/generate", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        outs = resp.json()
        input_lps = [list(o["meta_info"]["input_token_logprobs"][s - start:]) for o, s in zip(outs, starts)]
        rec.decision = decide(call.choices, input_lps)
        rec.t_end = now()
        rec.label = call.label
        rec.output_text = rec.decision
        rec.reported_prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        rec.cached_tokens = sum(o["meta_info"]["cached_tokens"] for o in outs)
        rec.finish_reason = "select"


def gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


class LlamaCpp(HTTPSystem):
    """llama-cpp-python's OpenAI-compatible server on the same GGUF, prompt cache on (``--systems
    llama-cpp-python``; ``llama.cpp`` is llama.cpp's own server, :mod:`llama_server`)."""
    name = "llama-cpp-python"

    def __init__(self, tokenizer: Any, gguf: str, threads: Optional[int] = None):
        super().__init__(tokenizer)
        self.gguf, self.threads = gguf, threads or os.cpu_count() or 1
        self.proc: Optional[subprocess.Popen] = None
        self.context_length = 2048
        self.ban = {str(i): -1e9 for i in tokenizer.all_special_ids}
        self._gbnf: dict[str, str] = {}

    def unavailable(self) -> Optional[str]:
        missing = [m for m in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")
                   if importlib.util.find_spec(m) is None]
        if missing:
            return (f"llama-cpp-python[server] is not installed (missing: {', '.join(missing)}); it builds "
                    "llama.cpp from source: pip install -e '.[peers]'")
        return None

    def _cmd(self, port: int) -> list[str]:
        t = str(self.threads)
        return [sys.executable, "-m", "llama_cpp.server", "--model", self.gguf, "--host", "127.0.0.1",
                "--port", str(port), "--n_ctx", str(self.context_length), "--n_threads", t, "--n_threads_batch", t,
                "--cache", "true", "--cache_type", "ram", "--logits_all", "false", "--interrupt_requests", "false",
                "--verbose", "false"]

    def describe(self) -> dict:
        import importlib.metadata as md
        try:
            v = md.version("llama_cpp_python")
        except md.PackageNotFoundError:
            v = None
        return {"cmd": " ".join(self._cmd(0)[1:]), "api": "POST /v1/completions (stream)", "version": v}

    def start(self, context_length: int) -> None:
        from server_util import free_port
        self.context_length = context_length
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.logdir = tempfile.mkdtemp(prefix="bench-llamacpp-")
        self.proc = subprocess.Popen(self._cmd(port), stdout=open(os.path.join(self.logdir, "stdout"), "w"),
                                     stderr=open(os.path.join(self.logdir, "stderr"), "w"), start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                err = Path(self.logdir, "stderr").read_text()[-3000:]
                raise RuntimeError(f"llama.cpp server exited with {self.proc.returncode}:\n{err}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=5, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("llama.cpp server not ready after 300 s")

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def reset(self) -> bool:
        """Its cache has no flush endpoint: a restart (about a second) gives every workload a cold cache."""
        self.stop()
        self.start(self.context_length)
        return True

    def grammar(self, schema: dict) -> str:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._gbnf:
            from llama_cpp.llama_grammar import json_schema_to_gbnf
            self._gbnf[key] = json_schema_to_gbnf(json.dumps(schema))
        return self._gbnf[key]

    async def call(self, client: httpx.AsyncClient, call: Any, rec: Record) -> None:
        body: dict = {"temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 0,
                      "stream": True}
        if isinstance(call, Select):
            body.update(prompt=call.context, max_tokens=max(len(self.tok.encode(c)) for c in call.choices) + 2,
                        grammar="root ::= " + " | ".join(gbnf_literal(c) for c in call.choices))
        else:
            body.update(prompt=call.prompt, max_tokens=call.max_new_tokens)
            if call.ignore_eos:
                body["logit_bias"] = self.ban
            if call.json_schema is not None:
                body["grammar"] = self.grammar(call.json_schema)
        rec.t_send = now()
        text, finish = "", None
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            async for data in sse_lines(resp):
                t = now()
                d = json.loads(data)
                if "error" in d:
                    raise RuntimeError(f"stream error: {d['error']}")
                ch = (d.get("choices") or [{}])[0]
                delta = ch.get("text") or ""
                if delta:
                    text += delta
                    rec.chunk_times.append(t)
                    if rec.t_first is None:
                        rec.t_first = t
                finish = ch.get("finish_reason") or finish
        rec.t_end = now()
        rec.finish_reason = finish
        if isinstance(call, Select):
            rec.kind, rec.label = "select", call.label
            rec.decision = next((c for c in call.choices if text == c), None) or \
                next((c for c in call.choices if text.startswith(c) or c.startswith(text)), text)
            rec.output_text = text
            rec.t_first, rec.chunk_times = None, []   # a select's TTFT is its latency on every system
            return
        rec.output_text = text
        # its stream carries no usage: count the text's tokens, plus the EOS it stopped on
        rec.output_tokens = len(self.tok.encode(text, add_special_tokens=False)) + (1 if finish == "stop" else 0)


# ---- HF transformers generate: static batches in this process ----------------------------------------------


class HFGenerate(System):
    name = "hf-generate"
    has_cache_report = True   # it caches nothing between calls: 0 cached tokens, truthfully

    def __init__(self, tokenizer: Any, batch_size: int = 16, threads: Optional[int] = None):
        self.tok, self.batch_size, self.threads = tokenizer, batch_size, threads
        self.model = None
        self.eos_ids = eos_ids_of(tokenizer)
        self._compiler = None
        self._compiled: dict[str, Any] = {}

    def describe(self) -> dict:
        import torch
        import transformers
        return {"api": "LlamaForCausalLM.generate, greedy, static batches (left padding)",
                "batch_size": self.batch_size, "dtype": "float32", "torch_threads": torch.get_num_threads(),
                "transformers": transformers.__version__}

    def start(self, context_length: int) -> None:
        from transformers.utils import logging as hf_logging

        from radixrt.runtime.models.loader import load_hf_model
        import torch
        hf_logging.set_verbosity_error()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.model = load_hf_model()
        gc = self.model.generation_config
        eos = gc.eos_token_id if gc.eos_token_id is not None else self.tok.eos_token_id
        self.eos_ids |= set(eos if isinstance(eos, list) else [eos])
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.eos_ids)

    def stop(self) -> None:
        self.model = None

    def warmup(self) -> None:
        self._gen([Gen("Hello, how are you today?", 8)])

    def compiled(self, schema: dict) -> Any:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            import xgrammar as xgr
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tok, vocab_size=self.model.config.vocab_size)
                self._compiler = xgr.GrammarCompiler(info)
            # compact JSON (no whitespace outside strings), as radixrt's grammar backend compiles it
            self._compiled[key] = self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                                     separators=(",", ":"))
        return self._compiled[key]

    def run(self, wl: Workload, programs: list, pbar: Any, concurrency: int = 0) -> list[Record]:
        out: list[Record] = []
        for b0 in range(0, len(programs), self.batch_size):
            active: dict[int, list] = {}
            for pid in range(b0, min(b0 + self.batch_size, len(programs))):
                try:
                    active[pid] = [programs[pid], next(programs[pid]), 0]
                except StopIteration:
                    pass
            while active:   # lockstep: every live program of the batch makes its next call together
                groups: dict[tuple, list[int]] = defaultdict(list)
                for pid, (_, call, _) in active.items():
                    groups[call_key(call)].append(pid)
                for key, pids in groups.items():
                    calls = [active[p][1] for p in pids]
                    try:
                        recs = self._select(calls) if key[0] == "select" else self._gen(calls)
                        err = None
                    except Exception as e:
                        t = now()
                        recs = [Record("", "", 0, 0, c.kind, t, t) for c in calls]
                        err = f"{type(e).__name__}: {e}"
                    for pid, rec, call in zip(pids, recs, calls):
                        rec.workload, rec.system, rec.program, rec.step = wl.name, self.name, pid, active[pid][2]
                        rec.call = call  # type: ignore[attr-defined]
                        rec.error = err
                        out.append(rec)
                        pbar.update(1)
                        prog = active[pid][0]
                        if err is not None:
                            prog.close()
                            del active[pid]
                            continue
                        try:
                            active[pid][1] = prog.send(rec)
                            active[pid][2] += 1
                        except StopIteration:
                            del active[pid]
        return out

    def _gen(self, calls: list[Gen]) -> list[Record]:
        """One static batch: left-padded, greedy, run to the longest ``max_new_tokens`` of the batch; each row is
        cut at its own limit or its first EOS."""
        import torch
        from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

        class StepTimer(LogitsProcessor):
            def __init__(self):
                self.times: list[float] = []

            def __call__(self, input_ids, scores):
                self.times.append(now())
                return scores

        c0 = calls[0]
        t0 = now()
        rows = [prompt_ids(self.tok, c, self.eos_ids) for c in calls]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        procs = LogitsProcessorList()
        if c0.json_schema is not None:
            import xgrammar as xgr
            import xgrammar.contrib.hf  # noqa: F401
            procs.append(xgr.contrib.hf.LogitsProcessor(self.compiled(c0.json_schema)))
        timer = StepTimer()
        procs.append(timer)
        n = max(c.max_new_tokens for c in calls)
        gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n if c0.ignore_eos else 0, do_sample=False,
                              pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids))
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc,
                                      logits_processor=procs)
        t1 = now()
        recs = []
        for i, c in enumerate(calls):
            new = out[i, width:].tolist()[:c.max_new_tokens]
            k = None if c0.ignore_eos else next((j for j, t in enumerate(new) if t in self.eos_ids), None)
            n_i = len(new) if k is None else k + 1
            r = Record("", "", 0, 0, "gen", t_send=t0, t_end=t1)
            r.sent_ids, r.output_ids = rows[i], new[:n_i]
            r.chunk_times = timer.times[:n_i]
            r.t_first = r.chunk_times[0] if r.chunk_times else None
            r.output_tokens = n_i
            r.output_text = self.tok.decode(new[:n_i], skip_special_tokens=True)
            r.finish_reason = "stop" if k is not None else "length"
            r.reported_prompt_tokens = len(rows[i])
            r.cached_tokens = 0
            recs.append(r)
        return recs

    def _select(self, calls: list[Select], fast: bool = True) -> list[Record]:
        import torch
        t0 = now()
        bounds = [select_boundaries(self.tok, c.context, c.choices) for c in calls]
        ctxs = [self.tok.encode(c.context, add_special_tokens=False) for c in calls]
        single = fast and all(len(f) == len(ctx) + 1 and f[:len(ctx)] == ctx
                     for ctx, (fulls, _, _) in zip(ctxs, bounds) for f in fulls)
        # rows to run, and per (call, option): (row, [(position from the end, token id), ...])
        rows: list[list[int]] = []
        where: list[list[tuple[int, list[tuple[int, int]]]]] = []
        if single:   # every option is one token after the context: one forward over the contexts
            for ctx, (fulls, _, _) in zip(ctxs, bounds):
                rows.append(ctx)
                where.append([(len(rows) - 1, [(1, f[-1])]) for f in fulls])
        else:
            for fulls, starts, _ in bounds:
                w = []
                for f, s in zip(fulls, starts):
                    rows.append(f)
                    m = len(f) - s
                    w.append((len(rows) - 1, [(m + 1 - j, f[s + j]) for j in range(m)]))
                where.append(w)
        keep = max(p for w in where for _, ps in w for p, _ in ps)
        lps_rows: list[Any] = []
        with torch.inference_mode():
            for b in range(0, len(rows), self.batch_size):
                chunk = rows[b:b + self.batch_size]
                width = max(len(r) for r in chunk)
                ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in chunk])
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk])
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                    logits_to_keep=keep).logits
                lps_rows.extend(torch.log_softmax(logits.float(), -1))
        t1 = now()
        recs = []
        for c, w, (fulls, _, _) in zip(calls, where, bounds):
            # logits at index keep - p predict the token p - 1 places before the end
            input_lps = [[[float(lps_rows[row][keep - p, tid]), tid] for p, tid in ps] for row, ps in w]
            r = Record("", "", 0, 0, "select", t_send=t0, t_end=t1)
            r.decision = decide(c.choices, input_lps)
            r.output_text, r.label, r.finish_reason = r.decision, c.label, "select"
            r.scores = [sum(t[0] for t in lps) / len(lps) for lps in input_lps]  # type: ignore[attr-defined]
            r.reported_prompt_tokens = sum(len(f) for f in fulls)
            r.cached_tokens = 0
            recs.append(r)
        return recs
