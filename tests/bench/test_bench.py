"""The benchmark suite (benchmarks/, issue 7): the metric code on synthetic timestamps with known values, the
workload plumbing, and a smoke run of every workload at tiny sizes against radixrt alone (one server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import metrics as M  # noqa: E402
import workloads as W  # noqa: E402


def rec(t_send, t_first, t_end, out=0, chunks=(), kind="gen", **kw):
    r = M.Record(
        "w", "s", 0, 0, kind, t_send=t_send, t_end=t_end, t_first=t_first, chunk_times=list(chunks), output_tokens=out
    )
    for k, v in kw.items():
        setattr(r, k, v)
    return r


# ---- metrics on synthetic timestamps ---------------------------------------------------------------------------


def test_percentiles_are_numpy_linear():
    xs = [0.5, 0.1, 0.4, 0.2, 0.3]
    s = M.stats(xs)
    assert s["mean"] == pytest.approx(0.3)
    assert s["p50"] == pytest.approx(0.3)
    assert s["p99"] == pytest.approx(0.496)  # k = 4 * 0.99 = 3.96 -> 0.4 + 0.96 * 0.1
    assert M.stats([])["mean"] is None
    assert M.stats([7.0]) == {"mean": 7.0, "p50": 7.0, "p99": 7.0, "n": 1}


def test_summary_serving_metrics_exact():
    # five requests sent at t = 0..0.4, first tokens 0.1..0.5 s after their send
    recs = []
    for i in range(5):
        t0 = i * 0.1
        ttft = (i + 1) * 0.1
        first = t0 + ttft
        chunks = [first, first + 0.1, first + 0.3, first + 0.6]  # ITL 0.1, 0.2, 0.3
        recs.append(
            rec(
                t0,
                first,
                first + 0.6,
                out=4,
                chunks=chunks,
                prompt_tokens=100,
                reported_prompt_tokens=100,
                cached_tokens=20 * i,
            )
        )
    m = M.summarize(recs, optimal=0.5, optimal_paged=0.4)
    duration = (0.4 + 0.5 + 0.6) - 0.0  # last finish - first send
    assert m["duration_s"] == pytest.approx(duration)
    assert m["completed"] == 5 and m["failed"] == 0
    assert m["request_throughput"] == pytest.approx(5 / duration)
    assert m["input_throughput"] == pytest.approx(500 / duration)
    assert m["output_throughput"] == pytest.approx(20 / duration)
    assert m["ttft_s"]["mean"] == pytest.approx(0.3)
    assert m["ttft_s"]["p50"] == pytest.approx(0.3)
    assert m["ttft_s"]["p99"] == pytest.approx(0.496)
    # TPOT = (e2e - ttft) / (out - 1) = 0.6 / 3 for every request
    assert m["tpot_s"]["mean"] == pytest.approx(0.2)
    assert m["tpot_s"]["p99"] == pytest.approx(0.2)
    # ITL pooled: 5 x [0.1, 0.2, 0.3] -> mean 0.2; sorted 15 values, k = 14 * 0.99 = 13.86 -> 0.3
    assert m["itl_s"]["mean"] == pytest.approx(0.2)
    assert m["itl_s"]["p50"] == pytest.approx(0.2)
    assert m["itl_s"]["p99"] == pytest.approx(0.3)
    assert m["itl_s"]["n"] == 15
    assert m["e2e_s"]["mean"] == pytest.approx(0.3 + 0.6)
    assert m["hit_rate"] == pytest.approx((0 + 20 + 40 + 60 + 80) / 500)
    assert m["optimal_hit_rate"] == 0.5 and m["optimal_hit_rate_paged"] == 0.4
    assert m["json_valid_share"] is None and m["select_accuracy"] is None


def test_summary_tpot_itl_edge_cases_and_failures():
    one_token = rec(0.0, 0.2, 0.2, out=1, chunks=[0.2])  # no TPOT, no ITL
    select = rec(0.0, None, 0.5, kind="select", decision=" a", label=" a")  # TTFT = e2e
    select2 = rec(0.1, None, 0.3, kind="select", decision=" b", label=" a")
    failed = rec(0.0, None, 9.0, error="boom")
    m = M.summarize([one_token, select, select2, failed])
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["duration_s"] == pytest.approx(0.5)  # failed calls do not count
    assert m["tpot_s"]["n"] == 0 and m["itl_s"]["n"] == 0
    assert sorted(r.ttft for r in (one_token, select, select2)) == pytest.approx([0.2, 0.2, 0.5])
    assert m["ttft_s"]["mean"] == pytest.approx(0.3)
    assert m["hit_rate"] is None  # nobody reported cached tokens
    assert m["select_accuracy"] == 0.5


def test_summary_json_validity_share():
    rs = [rec(0, 0.1, 1, out=2, chunks=[0.1, 1], json_valid=v) for v in (True, True, False, True)]
    assert M.summarize(rs)["json_valid_share"] == 0.75


def test_optimal_hit_rate_orders_sends_and_finishes():
    a = list(range(1, 11))  # 10 tokens, sent at 0, done at 1 with 2 output tokens
    b = list(range(1, 6)) + [99]  # sent at 0.5, before a finished: shares a's prompt (5)
    c = list(range(1, 14))  # sent at 2: shares a's prompt + output (12)
    d = [7, 8]  # sent at 1 exactly when a finishes: nothing in common
    ev = [(0.0, 1.0, [a], a + [11, 12]), (0.5, 3.0, [b], None), (2.0, 3.0, [c], None), (1.0, 1.5, [d], None)]
    assert M.optimal_hit_rate(ev) == pytest.approx((0 + 5 + 12 + 0) / (10 + 6 + 13 + 2))
    assert M.optimal_hit_rate(ev, page=4) == pytest.approx((0 + 4 + 12 + 0) / 31)
    # the options of one select are sent in order: the 2nd reuses the 1st's prefix
    assert M.optimal_hit_rate([(0.0, 1.0, [[1, 2, 3, 4], [1, 2, 3, 5]], None)]) == pytest.approx(3 / 8)
    assert M.optimal_hit_rate([]) is None


def test_ratio():
    assert M.ratio(6.0, 2.0) == 3.0
    assert M.ratio(1.0, 0) is None and M.ratio(None, 1.0) is None


# ---- workloads ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    from radixrt.runtime.models.loader import load_tokenizer

    return load_tokenizer()


def test_chatml_matches_the_models_chat_template(tok):
    msgs = [("system", "Be brief."), ("user", "hi"), ("assistant", "hello"), ("user", "and?")]
    want = tok.apply_chat_template(
        [{"role": r, "content": c} for r, c in msgs], tokenize=False, add_generation_prompt=True
    )
    assert W.chatml(msgs) == want


def test_workloads_are_deterministic_and_sized(tok):
    words = W.Words(tok)
    z = W.Sizes()
    a = W.build(list(W.WORKLOADS), words, z)
    b = W.build(list(W.WORKLOADS), words, z)
    assert [w.name for w in a] == [
        "shared-prefix",
        "agent-loop",
        "multi-turn-chat",
        "few-shot-select",
        "json-decode",
        "json-decode-free",
    ]
    for wa, wb in zip(a, b):
        ca, cb = next(wa.make_programs()[0]), next(wb.make_programs()[0])
        assert ca == cb
        assert (
            len(wa.make_programs())
            * (z.agent_steps if wa.name == "agent-loop" else z.chat_turns if wa.name == "multi-turn-chat" else 1)
            == wa.n_calls
        )
    prompts = [next(p).prompt for p in a[0].make_programs()]
    n = len(tok.encode(prompts[0], add_special_tokens=False))
    assert abs(n - (z.sp_system_len + z.sp_question_len + 5)) <= 8
    prefixes = {p.split("\n\nQuestion:")[0] for p in prompts}
    assert len(prefixes) == z.sp_groups


def test_continuation_ids_extend_the_previous_call(tok):
    from systems.base import eos_ids_of, prompt_ids

    eos = eos_ids_of(tok)
    first = W.Gen(W.chatml([("system", "S"), ("user", "Q")]), 8)
    prev = M.Record("w", "s", 0, 0, "gen", 0.0, 1.0)
    prev.sent_ids = prompt_ids(tok, first, eos)
    assert prev.sent_ids == tok.encode(first.prompt, add_special_tokens=False)
    answer = '{"tool":"search"}'
    prev.output_ids = [tok.encode(ch, add_special_tokens=False)[0] for ch in answer] + [tok.eos_token_id]
    prev.output_text = answer
    suffix = "<|im_end|>\n" + W.chatml([("user", "Observation: ok")])
    nxt = W.Gen(first.prompt + answer + suffix, 8, cont=(prev, suffix))
    ids = prompt_ids(tok, nxt, eos)
    assert ids[: len(prev.sent_ids) + len(prev.output_ids)] == prev.sent_ids + prev.output_ids
    assert tok.decode(ids) == nxt.prompt
    # stopped by length (no EOS): the EOS text stays in the suffix
    prev.output_ids = prev.output_ids[:-1]
    assert tok.decode(prompt_ids(tok, nxt, eos)) == nxt.prompt


def test_hf_select_fast_path_matches_full_scoring(tok, hf_model):
    from systems.hf_generate import HFGenerate

    hf = HFGenerate(tok, batch_size=4, threads=None)
    hf.start(1024, model=hf_model)  # the session's transformers model: the one load_hf_model() gives
    calls = [
        W.Select("Review: The lamp is wonderful and the box is lovely.\nSentiment:", list(W.CHOICES)),
        W.Select(
            "A much longer context so that the batch has left padding. Review: The chair is flimsy.\nSentiment:",
            list(W.CHOICES),
        ),
    ]
    fast, full = hf._select(calls), hf._select(calls, fast=False)
    for a, b in zip(fast, full):
        assert a.decision == b.decision
        assert a.scores == pytest.approx(b.scores, abs=1e-3)
    multi = hf._select([W.Select("The capital of France is", [" Paris, France", " Berlin", " a city"])])
    assert multi[0].decision in (" Paris, France", " Berlin", " a city")
    hf.stop()


# ---- smoke: every workload, tiny, radixrt alone -------------------------------------------------------------


def test_smoke_every_workload_on_radixrt(tmp_path, capsys):
    import run_all

    res = run_all.main(["--preset", "tiny", "--systems", "radixrt", "--out-dir", str(tmp_path), "--no-roofline"])
    out = capsys.readouterr().out
    names = ["shared-prefix", "agent-loop", "multi-turn-chat", "few-shot-select", "json-decode", "json-decode-free"]
    z = W.Sizes(**W.TINY)
    calls = {
        "shared-prefix": z.sp_groups * z.sp_per_group,
        "agent-loop": z.agent_programs * z.agent_steps,
        "multi-turn-chat": z.chat_convs * z.chat_turns,
        "few-shot-select": z.select_inputs,
        "json-decode": z.json_requests,
        "json-decode-free": z.json_requests,
    }
    for n in names:
        m = res["workloads"][n]["radixrt"]["summary"]
        assert m["completed"] == calls[n] and m["failed"] == 0, (n, res["workloads"][n]["radixrt"]["errors"])
        assert m["request_throughput"] > 0 and m["ttft_s"]["mean"] > 0
        assert m["hit_rate"] is not None and m["optimal_hit_rate"] is not None
        assert m["hit_rate"] <= m["optimal_hit_rate"] + 0.01
        assert f"== {n}:" in out
        assert (tmp_path / f"{n}.png").stat().st_size > 10_000
    assert res["workloads"]["shared-prefix"]["radixrt"]["summary"]["hit_rate"] > 0
    assert res["workloads"]["multi-turn-chat"]["radixrt"]["summary"]["hit_rate"] > 0
    assert res["workloads"]["json-decode"]["radixrt"]["summary"]["json_valid_share"] == 1.0
    assert res["workloads"]["few-shot-select"]["radixrt"]["summary"]["select_accuracy"] is not None
    assert res["workloads"]["agent-loop"]["radixrt"]["summary"]["tpot_s"]["n"] > 0
    # json-decode-free generated as many tokens as json-decode, request by request
    rec = {
        n: {r["program"]: r["output_tokens"] for r in res["workloads"][n]["radixrt"]["records"]}
        for n in ("json-decode", "json-decode-free")
    }
    assert rec["json-decode"] == rec["json-decode-free"]
    assert "== targets" in out and len(res["targets"]) == 7
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert set(saved["workloads"]) == set(names)
    assert saved["targets"][0]["met"] is None  # radixrt-nocache was not run


# ---- the llama.cpp client against a stand-in server (llama-cpp-python builds from source; see README) --------


def test_llamacpp_client_against_a_fake_server(tok):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tqdm import tqdm

    from systems.llama_cpp_python import LlamaCpp

    bodies = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            g = body.get("grammar")
            if g and g.startswith('root ::= "'):  # a select: the first option
                pieces, finish = [g.split('"')[1]], "stop"
            elif body.get("logit_bias"):  # ignore_eos: exactly max_tokens
                pieces, finish = [" tok"] * body["max_tokens"], "length"
            else:
                pieces, finish = [" tok"] * min(3, body["max_tokens"]), "stop"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b": ping\r\n\r\n")
            for p in pieces + [""]:
                ch = {
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": p, "finish_reason": None if p else finish}],
                }
                self.wfile.write(f"data: {json.dumps(ch)}\r\n\r\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\r\n\r\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        lc = LlamaCpp(tok, gguf="unused.gguf")
        lc.url = f"http://127.0.0.1:{srv.server_address[1]}"
        z = W.Sizes(**W.TINY)
        words = W.Words(tok)
        for wl in W.build(["multi-turn-chat", "few-shot-select"], words, z):
            recs = lc.run(wl, wl.make_programs(), tqdm(disable=True))
            assert len(recs) == wl.n_calls and all(r.error is None for r in recs), [r.error for r in recs]
            for r in recs:
                if wl.name == "few-shot-select":
                    assert r.kind == "select" and r.decision == W.CHOICES[0] and r.t_first is None
                else:
                    assert r.output_tokens == z.chat_reply_len and len(r.chunk_times) == z.chat_reply_len
                    assert r.ttft > 0 and r.finish_reason == "length" and r.cached_tokens is None
            if wl.name == "multi-turn-chat":  # turn 2 carries turn 1's answer, as text
                by_step = sorted(recs, key=lambda r: r.step)
                assert by_step[1].call.prompt.startswith(by_step[0].call.prompt + by_step[0].output_text)
        chat, sel = bodies[0], bodies[-1]
        assert chat["stream"] is True and chat["temperature"] == 0 and chat["repeat_penalty"] == 1.0
        assert set(chat["logit_bias"]) >= {str(tok.eos_token_id)}
        assert sel["grammar"] == 'root ::= " positive" | " negative" | " neutral" | " mixed"'
        assert "logit_bias" not in sel
    finally:
        srv.shutdown()
