"""The llama-server peer (benchmarks/systems/llama_server.py) against a stand-in for its native ``/completion`` stream,
and issue 12's two target workloads (benchmarks/target_workloads.py). ``make peers`` builds the real server;
``make bench`` runs it (not part of ``make test``)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import target_workloads as T  # noqa: E402
import workloads as W  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from radixrt.runtime.models.loader import load_tokenizer

    return load_tokenizer()


def test_target_workloads_shapes(tok):
    words = W.Words(tok)
    z = W.Sizes()
    dep = T.agent_dependent(words, z)
    assert (dep.n_calls, dep.concurrency, dep.max_new_tokens) == (4, 1, 32)
    [prog] = dep.make_programs()
    first = next(prog)
    assert first.ignore_eos and first.max_new_tokens == 32 and first.json_schema is None
    system = first.prompt.split("<|im_start|>system\n")[1].split("<|im_end|>")[0]
    tools = system.split("Tools:\n")[1]
    assert len(tools.splitlines()) == 35 and all(
        line.startswith(f"- tool_{i}:") for i, line in enumerate(tools.splitlines())
    )
    assert sum(len(line.split(":", 1)[1].split()) for line in tools.splitlines()) == 700
    ss = T.shared_system_16(words, z)
    assert (ss.n_calls, ss.concurrency, ss.max_new_tokens) == (32, 16, 16)
    calls = [next(p) for p in ss.make_programs()]
    systems = {c.prompt.split("<|im_end|>")[0] for c in calls}
    assert len(systems) == 4 and all(len(s.split("\n", 1)[1].split()) == 700 for s in systems)
    import run_all

    names = [w.name for w in run_all.build_workloads(["all"], words, W.Sizes(**W.TINY))]
    assert names == [
        "shared-prefix",
        "agent-loop",
        "multi-turn-chat",
        "few-shot-select",
        "json-decode",
        "json-decode-free",
        "agent-dependent",
        "shared-system-16",
    ]


def test_llama_server_client_against_a_fake_server(tok):
    from tqdm import tqdm

    from systems.llama_server import LlamaServer

    bodies = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            assert self.path == "/completion"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            n = body["n_predict"] if body.get("ignore_eos") else 2
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n):  # token ids 1000, 1001, ...; text " w0", " w1", ...
                ch = {"content": f" w{i}", "tokens": [1000 + i], "stop": False}
                self.wfile.write(f"data: {json.dumps(ch)}\n\n".encode())
                self.wfile.flush()
            cached = 5 if len(bodies) > 1 else 0
            final = {
                "content": "",
                "tokens": [],
                "stop": True,
                "stop_type": "limit" if body.get("ignore_eos") else "eos",
                "timings": {
                    "cache_n": cached,
                    "prompt_n": len(body["prompt"]) - cached,
                    "predicted_n": n if body.get("ignore_eos") else n + 1,
                },
            }
            self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        ls = LlamaServer(tok, gguf="unused.gguf", threads=2)
        ls.url = f"http://127.0.0.1:{srv.server_address[1]}"
        ls.configure(16)
        cmd = ls._cmd(8080)
        assert cmd[cmd.index("-np") + 1] == "16" and "-kvu" in cmd and "--cache-prompt" in cmd
        ls.configure(1)
        assert ls._cmd(8080)[ls._cmd(8080).index("-np") + 1] == "1"
        z = W.Sizes(**W.TINY)
        [wl] = W.build(["multi-turn-chat"], W.Words(tok), z)
        recs = sorted(ls.run(wl, wl.make_programs(), tqdm(disable=True)), key=lambda r: r.step)
        assert len(recs) == wl.n_calls == 4 and all(r.error is None for r in recs)
        reply = [1000 + i for i in range(z.chat_reply_len)]
        for r, body in zip(recs, bodies):
            assert body["prompt"] == r.sent_ids and body["ignore_eos"] is True and body["cache_prompt"] is True
            assert body["n_predict"] == z.chat_reply_len and body["temperature"] == 0.0
            assert r.output_ids == reply and r.output_tokens == z.chat_reply_len
            assert r.output_text == "".join(f" w{i}" for i in range(z.chat_reply_len))
            assert len(r.chunk_times) == z.chat_reply_len and r.finish_reason == "length"
        # turn 2 sends turn 1's ids, the ids the model produced, then the new text tokenized
        assert recs[1].sent_ids[: len(recs[0].sent_ids) + len(reply)] == recs[0].sent_ids + reply
        assert [r.cached_tokens for r in recs] == [0, 5, 5, 5]
        assert recs[1].reported_prompt_tokens == len(recs[1].sent_ids)
        # a JSON call: the schema goes to the server; it stopped on EOS, which radixrt counts as a token
        [js] = W.build(["json-decode"], W.Words(tok), z)[:1]
        recs = ls.run(js, js.make_programs(), tqdm(disable=True))
        assert bodies[-1]["json_schema"] == W.PERSON_SCHEMA and "ignore_eos" not in bodies[-1]
        assert recs[0].output_ids == [1000, 1001, tok.eos_token_id] and recs[0].output_tokens == 3
        assert recs[0].finish_reason == "stop"
    finally:
        srv.shutdown()
