"""``radixrt`` and ``radixrt-nocache``: ``radixrt serve``, native ``POST /generate`` (streamed).

``select`` is the request ``rt.select`` sends (``radixrt.lang.choices``): one prefill-only request carrying
every ``context + option``, scored by token-length-normalized input logprobs. ``radixrt-nocache`` is the same
server with ``--disable-radix-cache`` (the ablation)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .base import HTTPSystem, Record, Select, decide, eos_ids_of, now, prompt_ids, select_boundaries, stream_json
from .process import Server, free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout: `python -m radixrt` runs from here


class RadixRT(HTTPSystem):
    """``radixrt serve`` in its own process group, on a free port (and a free DSL port)."""

    has_cache_report = True

    def __init__(self, tokenizer: Any, name: str = "radixrt", extra: tuple = (), max_total_tokens: int = 32768):
        super().__init__(tokenizer)
        self.name, self.extra, self.max_total_tokens = name, tuple(extra), max_total_tokens
        self.proc = None
        self.eos_ids = eos_ids_of(tokenizer)

    def quant(self) -> tuple:
        """``--quantization auto`` unless the extra flags choose: what users get, the GGUF's own q4, as llama.cpp
        runs on the same file."""
        return () if "--quantization" in self.extra else ("--quantization", "auto")

    def describe(self) -> dict:
        return {
            "cmd": "python -m radixrt serve " + " ".join(self.quant() + self.extra),
            "api": "POST /generate (stream)",
            "max_total_tokens": self.max_total_tokens,
        }

    def start(self, context_length: int) -> None:
        port, zmq_port = free_port(), free_port()
        while zmq_port == port:
            zmq_port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "radixrt",
            "serve",
            "--port",
            str(port),
            "--zmq-port",
            str(zmq_port),
            "--context-length",
            str(context_length),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--log-level",
            "warning",
            *self.quant(),
            *self.extra,
        ]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = Server(cmd, "radixrt serve", "radixrt-bench-", cwd=ROOT)
        self.proc.wait_ready(self.url + "/health", timeout=600, poll=0.2)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.shutdown()
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
        rec.sent_ids = prompt_ids(self.tok, call, self.eos_ids)  # tokenized here, as rt.select does
        body = {"input_ids": rec.sent_ids, "sampling_params": sp, "stream": True}
        last, seen = None, 0
        async for t, d in stream_json(client, "/generate", body):
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
        body = {
            "input_ids": fulls,
            "return_logprob": True,
            "logprob_start_len": start,
            "sampling_params": {"max_new_tokens": 0},
        }
        resp = await client.post("/generate", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        outs = resp.json()
        input_lps = [list(o["meta_info"]["input_token_logprobs"][s - start :]) for o, s in zip(outs, starts)]
        rec.decision = decide(call.choices, input_lps)
        rec.t_end = now()
        rec.label = call.label
        rec.output_text = rec.decision
        rec.reported_prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        rec.cached_tokens = sum(o["meta_info"]["cached_tokens"] for o in outs)
        rec.finish_reason = "select"
