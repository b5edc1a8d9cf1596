"""``llama.cpp``: llama.cpp's own ``llama-server`` (built by ``make peers``) as a benchmark peer on the same GGUF.

It runs the file's Q4_1 weights natively, with ``--threads`` compute threads, the prompt cache on
(``--cache-prompt``, ``cache_prompt`` per request, and the RAM cache of idle slots), and ``--parallel``
slots in one unified KV buffer (``-kvu``): as many slots as the workload has requests in flight (at most
16), 1 where it sends one at a time. It is restarted before each workload, so every system starts with a cold cache.

The server is OpenAI-compatible; the harness drives its native ``POST /completion`` because that endpoint
takes and returns token ids. So a continuation (agent loop, chat) sends exactly the ids radixrt is sent:
the previous prompt's ids, the model's own output ids, then the new text tokenized. Re-tokenizing the text
would split the answer differently and defeat any prefix cache there. Per request: greedy (temperature 0),
``ignore_eos`` for fixed lengths, ``json_schema`` (converted to a grammar by the server itself) for JSON
calls, and for ``select`` a greedy generation under the GBNF grammar ``" opt1" | " opt2" | ...``.
Cached tokens are the server's ``timings.cache_n``; output tokens its ``timings.predicted_n``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import httpx
from peers import LLAMA_CPP_PYTHON_VERSION, llama_binary, missing_notice

from .base import (
    Record,
    RestartedServer,
    Select,
    choices_grammar,
    eos_ids_of,
    finish_grammar_select,
    now,
    prompt_ids,
    stream_json,
)
from .process import Server, free_port

CONCURRENT_SLOTS = 16


class LlamaServer(RestartedServer):
    name = "llama.cpp"
    has_cache_report = True

    def __init__(self, tokenizer: Any, gguf: str, threads: Optional[int] = None, extra: tuple[str, ...] = ()):
        super().__init__(tokenizer)
        self.gguf, self.threads, self.extra = gguf, threads or os.cpu_count() or 1, tuple(extra)
        self.exe = llama_binary("llama-server")
        self.slots = CONCURRENT_SLOTS
        self.eos_ids = eos_ids_of(tokenizer)

    def unavailable(self) -> Optional[str]:
        return None if self.exe else missing_notice("llama-server")

    def configure(self, in_flight: int) -> None:
        """Slots for the next workload: one per request in flight (``-np`` = the concurrency), at most 16."""
        self.slots = max(1, min(in_flight, CONCURRENT_SLOTS))

    def _cmd(self, port: int) -> list[str]:
        t = str(self.threads)
        # -c is the unified KV buffer shared by the slots: room for every slot's full context
        return [
            self.exe or "llama-server",
            "-m",
            self.gguf,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            t,
            "-tb",
            t,
            "-c",
            str(self.context_length * self.slots),
            "-np",
            str(self.slots),
            "-kvu",
            "--cache-prompt",
            "--no-webui",
            "--log-disable",
            *self.extra,
        ]

    def describe(self) -> dict:
        return {
            "cmd": " ".join(self._cmd(0)),
            "api": "POST /completion (stream, token ids)",
            "llama_cpp_python_sdist": LLAMA_CPP_PYTHON_VERSION,
        }

    def start(self, context_length: int) -> None:
        self.context_length = context_length
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = Server(self._cmd(port), "llama-server", "bench-llama-server-")
        self.proc.wait_ready(self.url + "/health", timeout=300)  # /health answers 503 while the model loads

    async def call(self, client: httpx.AsyncClient, call: Any, rec: Record) -> None:
        body: dict = {
            "temperature": 0.0,
            "top_k": 1,
            "top_p": 1.0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "seed": 0,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
        }
        rec.t_send = now()
        if isinstance(call, Select):
            rec.sent_ids = self.tok.encode(call.context, add_special_tokens=False)
            body.update(
                n_predict=max(len(self.tok.encode(c, add_special_tokens=False)) for c in call.choices) + 2,
                grammar=choices_grammar(call.choices),
            )
        else:
            rec.sent_ids = prompt_ids(self.tok, call, self.eos_ids)
            body["n_predict"] = call.max_new_tokens
            if call.ignore_eos:
                body["ignore_eos"] = True
            if call.json_schema is not None:
                body["json_schema"] = call.json_schema
        body["prompt"] = rec.sent_ids
        text, ids, final = "", [], None
        async for t, d in stream_json(client, "/completion", body):
            if d.get("content") or d.get("tokens"):
                text += d.get("content") or ""
                ids += d.get("tokens") or []
                rec.chunk_times.append(t)
                if rec.t_first is None:
                    rec.t_first = t
            if d.get("stop"):
                final = d
        rec.t_end = now()
        if final is None:
            raise RuntimeError("the stream ended without a final chunk")
        timings = final.get("timings") or {}
        rec.cached_tokens = timings.get("cache_n")
        if timings.get("prompt_n") is not None and rec.cached_tokens is not None:
            rec.reported_prompt_tokens = timings["prompt_n"] + rec.cached_tokens
        rec.finish_reason = {"eos": "stop", "word": "stop", "limit": "length"}.get(
            final.get("stop_type"), final.get("stop_type")
        )
        if isinstance(call, Select):
            return finish_grammar_select(rec, call, text)
        rec.output_text = text
        if final.get("stop_type") == "eos" and not (ids and ids[-1] in self.eos_ids):
            ids.append(self.tok.eos_token_id)  # the EOS it stopped on is not streamed; radixrt counts it
        rec.output_ids = ids
        rec.output_tokens = int(timings.get("predicted_n", len(ids)))
