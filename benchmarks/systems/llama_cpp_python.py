"""``llama-cpp-python``: ``python -m llama_cpp.server`` (``llama-cpp-python[server]``, the ``[peers]`` extra) on
the same GGUF file with its RAM prompt cache on (``--cache true``) and ``/v1/completions`` streamed.

It serves one request at a time (requests queue in the server). JSON calls are constrained by a GBNF grammar
converted from the schema (``json_schema_to_gbnf``); ``select`` is a greedy generation under the grammar
``" opt1" | " opt2" | ...`` (its server returns prompt logprobs only by sorting the whole vocabulary in Python
per token, and only with ``logits_all``, which also makes its prompt-cache states huge); ``ignore_eos`` is a
logit bias of -1e9 on the special tokens. It reports no cached tokens, so its hit rate is n/a. Skipped, with
a notice, when ``llama_cpp`` is not importable."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any, Optional

import httpx

from .base import Record, RestartedServer, Select, choices_grammar, finish_grammar_select, now, stream_json
from .process import Server, free_port


class LlamaCpp(RestartedServer):
    """llama-cpp-python's OpenAI-compatible server on the same GGUF, prompt cache on (``--systems
    llama-cpp-python``; ``llama.cpp`` is llama.cpp's own server, :mod:`systems.llama_server`)."""

    name = "llama-cpp-python"

    def __init__(self, tokenizer: Any, gguf: str, threads: Optional[int] = None):
        super().__init__(tokenizer)
        self.gguf, self.threads = gguf, threads or os.cpu_count() or 1
        self.ban = {str(i): -1e9 for i in tokenizer.all_special_ids}
        self._gbnf: dict[str, str] = {}

    def unavailable(self) -> Optional[str]:
        missing = [
            m
            for m in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")
            if importlib.util.find_spec(m) is None
        ]
        if missing:
            return (
                f"llama-cpp-python[server] is not installed (missing: {', '.join(missing)}); it builds "
                "llama.cpp from source: pip install -e '.[peers]'"
            )
        return None

    def _cmd(self, port: int) -> list[str]:
        t = str(self.threads)
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            self.gguf,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(self.context_length),
            "--n_threads",
            t,
            "--n_threads_batch",
            t,
            "--cache",
            "true",
            "--cache_type",
            "ram",
            "--logits_all",
            "false",
            "--interrupt_requests",
            "false",
            "--verbose",
            "false",
        ]

    def describe(self) -> dict:
        import importlib.metadata as md

        try:
            v = md.version("llama_cpp_python")
        except md.PackageNotFoundError:
            v = None
        return {"cmd": " ".join(self._cmd(0)[1:]), "api": "POST /v1/completions (stream)", "version": v}

    def start(self, context_length: int) -> None:
        self.context_length = context_length
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = Server(self._cmd(port), "llama.cpp server", "bench-llamacpp-")
        self.proc.wait_ready(self.url + "/v1/models", timeout=300)

    def grammar(self, schema: dict) -> str:
        key = json.dumps(schema, sort_keys=True)
        if key not in self._gbnf:
            from llama_cpp.llama_grammar import json_schema_to_gbnf

            self._gbnf[key] = json_schema_to_gbnf(json.dumps(schema))
        return self._gbnf[key]

    async def call(self, client: httpx.AsyncClient, call: Any, rec: Record) -> None:
        body: dict = {"temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": 0, "stream": True}
        if isinstance(call, Select):
            body.update(
                prompt=call.context,
                max_tokens=max(len(self.tok.encode(c)) for c in call.choices) + 2,
                grammar=choices_grammar(call.choices),
            )
        else:
            body.update(prompt=call.prompt, max_tokens=call.max_new_tokens)
            if call.ignore_eos:
                body["logit_bias"] = self.ban
            if call.json_schema is not None:
                body["grammar"] = self.grammar(call.json_schema)
        rec.t_send = now()
        text, finish = "", None
        async for t, d in stream_json(client, "/v1/completions", body):
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
            return finish_grammar_select(rec, call, text)
        rec.output_text = text
        # its stream carries no usage: count the text's tokens, plus the EOS it stopped on
        rec.output_tokens = len(self.tok.encode(text, add_special_tokens=False)) + (1 if finish == "stop" else 0)
