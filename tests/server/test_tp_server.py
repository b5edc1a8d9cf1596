"""``radixrt serve --tp N`` on CPU (gloo), ranks as real processes: lockstep schedulers end to end.

- tp=3 on SmolLM2 (9 query / 3 KV heads): greedy tokens equal tp=1 on the parity prompts, every rank's
  radix tree reports the same hits, abort and constrained decoding (sampled, seeded) equal tp=1;
- tp=2 on a random-weight Llama directory (4 query / 2 KV heads) with a pool so small that decode preempts:
  greedy tokens equal tp=1 with the same pool; then one rank is SIGKILLed: the server answers 503 naming
  the rank and its exit code instead of hanging, restarts the ranks, and gives the same tokens again.
One server per configuration, shared by the module's tests.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from conftest import close_engine, make_engine
from server_util import ServerProc, sse_events, start_server

# a module's servers start inside its first test's limit; three ranks' start can pass 300 s on a loaded box
pytestmark = pytest.mark.timeout(900)

LENGTHS = [1, 7, 16, 33, 100]
NEW = 24
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}
SAMPLED = {"json_schema": json.dumps(SCHEMA), "temperature": 1.0, "seed": 7, "max_new_tokens": 160}
SMALL_POOL = 224  # tokens: 14 pages of 16; the five prompts + outputs need 19, so decode preempts


@pytest.fixture(scope="module")
def prompts(passage_ids):
    return [passage_ids[(13 * i) % 50 : (13 * i) % 50 + n] for i, n in enumerate(LENGTHS)]


def _start(*extra: str) -> ServerProc:
    return start_server(*extra, timeout=600)


@pytest.fixture(scope="module")
def tp3():
    s = _start("--tp", "3")
    yield s
    s.stop(timeout=60)


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory, tokenizer) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("llama-4q2kv")
    torch.manual_seed(0)
    # a wide init gives peaked logits, so greedy argmax has clear margins at any summation order
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.5,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


def _gen(c, input_ids, sp):
    r = c.post("/generate", json={"input_ids": input_ids, "sampling_params": sp})
    assert r.status_code == 200, r.text
    return r.json()


def _rank_stats(c) -> list[dict]:
    info = c.get("/get_server_info").json()
    return info["cache"]["tp_ranks"]


def test_tp3_greedy_parity_and_same_hits(tp3, prompts):
    ref_engine = make_engine(max_total_tokens=8192)
    try:
        ref = [o["output_ids"] for o in ref_engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        ref_sampled = ref_engine.generate(input_ids=prompts[3], sampling_params=SAMPLED)["text"]
    finally:
        close_engine(ref_engine)
    with tp3.client(timeout=600) as c:
        assert [o["output_ids"] for o in _gen(c, prompts, GREEDY)] == ref
        again = _gen(c, prompts[3:], GREEDY)  # the tree has them now: hits on every rank
        assert [o["output_ids"] for o in again] == ref[3:]
        assert all(o["meta_info"]["cached_tokens"] > 0 for o in again)
        stats = _rank_stats(c)
        assert len(stats) == 3
        keys = ("hit_tokens", "query_tokens", "evictable_pages", "free_pages", "protected_pages")
        assert all({k: s[k] for k in keys} == {k: stats[0][k] for k in keys} for s in stats), stats
        assert stats[0]["hit_tokens"] > 0
        # constrained decoding with a seeded sampler: the same JSON as tp=1
        out = _gen(c, prompts[3], SAMPLED)["text"]
        assert out == ref_sampled and set(json.loads(out)) == {"city", "population"}


def test_tp3_abort(tp3):
    with tp3.client(timeout=600) as c:
        body = {
            "text": "Count from one to a thousand:",
            "stream": True,
            "rid": "tp-abort-me",
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0},
        }
        with c.stream("POST", "/generate", json=body) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            assert c.post("/abort_request", json={"rid": "tp-abort-me"}).json() == {"success": True}
            rest = sse_events(lines)
        assert rest[-2]["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(rest[-2]["output_ids"]) < 200
        deadline = time.time() + 60
        while c.get("/get_server_info").json()["num_running"]:
            assert time.time() < deadline
            time.sleep(0.2)
        stats = _rank_stats(c)
        assert all(s["protected_pages"] == 0 and s["private_pages"] == 0 for s in stats), stats
        assert len({s["evictable_pages"] for s in stats}) == 1, stats


@pytest.fixture(scope="module")
def tp2_small(random_dir):
    s = _start("--tp", "2", "--model", random_dir, "--max-total-tokens", str(SMALL_POOL))
    yield s
    s.kill()


def test_tp2_preemption_parity_then_rank_killed(tp2_small, random_dir, prompts):
    ref_engine = make_engine(model=random_dir, max_total_tokens=SMALL_POOL)
    try:
        ref = [o["output_ids"] for o in ref_engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        assert ref_engine.get_server_info()["cache"]["num_preemptions"] > 0
    finally:
        close_engine(ref_engine)
    with tp2_small.client(timeout=600) as c:
        assert [o["output_ids"] for o in _gen(c, prompts, GREEDY)] == ref
        stats = _rank_stats(c)
        assert stats[0]["num_preemptions"] == stats[1]["num_preemptions"] > 0
        pids = c.get("/get_server_info").json()["process_ids"]
        workers = _children(pids["scheduler"])
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.time() + 120
        while True:  # no hang: the runtime says which rank died, then restarts the children
            r = c.get("/health")
            if r.status_code == 503:
                break
            assert time.time() < deadline, r.text
            time.sleep(0.2)
        assert r.json()["error"]["message"] == (
            f"the scheduler process exited unexpectedly (exit code 1: tensor-parallel rank 1 (pid {workers[0]}) "
            f"exited with code -9); restarting it, retry when GET /health returns 200"
        )
        while c.get("/health").status_code != 200:
            assert time.time() < deadline + 120
            time.sleep(0.2)
        info = c.get("/get_server_info").json()
        assert info["restarts"] == {"tp_rank": 1}
        assert len(_children(info["process_ids"]["scheduler"])) == 1  # a new rank 1
        assert [o["output_ids"] for o in _gen(c, prompts, GREEDY)] == ref  # same tokens after the restart
    assert "tensor-parallel rank 1" in tp2_small.logs()  # rank 0 names the rank that died


def _children(pid: int) -> list[int]:
    """Child pids of ``pid`` (Linux /proc), without the resource tracker multiprocessing may start."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    return [p for p in out if "resource_tracker" not in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def _healthy(c, timeout_s: float = 240) -> None:
    """Wait for 200 from /health: the rank-kill test may have run first, and its restart be under way."""
    deadline = time.time() + timeout_s
    while c.get("/health").status_code != 200:
        assert time.time() < deadline, "the --tp 2 server did not come back"
        time.sleep(0.2)


def test_tp2_control_messages_keep_the_ranks_in_step(tp2_small, prompts):
    """Open, generate in, flush beside, close a session; abort a running request; flush again: under --tp 2
    each of these messages makes its collectives on both ranks (runtime/scheduler/control.py). A rank that
    made another collective than rank 0 for any of them would hang the turn in gloo, and the next call
    would run into the client's 60 s timeout instead of answering."""
    with tp2_small.client(timeout=60) as c:
        _healthy(c)
        assert c.post("/flush_cache").status_code == 200
        sid = c.post("/open_session", json={"capacity_of_str_len": 200}).json()
        assert isinstance(sid, str) and len(sid) == 32, sid
        out = c.post(
            "/generate", json={"input_ids": prompts[3], "session_params": {"id": sid}, "sampling_params": GREEDY}
        ).json()
        assert len(out["output_ids"]) == NEW and out["meta_info"]["prompt_tokens"] == 33
        assert c.post("/flush_cache").status_code == 200  # the session's pages are pinned: they stay
        pinned = _rank_stats(c)
        assert pinned[0] == pinned[1], pinned
        assert pinned[0]["protected_pages"] == 3 and pinned[0]["evictable_pages"] == 0, pinned  # 56 KV tokens
        assert c.post("/close_session", json={"session_id": sid}).json() == {"success": True}
        assert c.post("/close_session", json={"session_id": sid}).json() == {"success": False}

        body = {
            "input_ids": prompts[4],
            "stream": True,
            "rid": "tp2-abort-me",
            "sampling_params": {"max_new_tokens": 100, "ignore_eos": True, "temperature": 0},
        }
        with c.stream("POST", "/generate", json=body) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            assert c.post("/abort_request", json={"rid": "tp2-abort-me"}).json() == {"success": True}
            rest = sse_events(lines)
        assert rest[-2]["meta_info"]["finish_reason"]["type"] == "abort"
        deadline = time.time() + 60
        while c.get("/get_server_info").json()["num_running"]:
            assert time.time() < deadline
            time.sleep(0.2)
        assert c.post("/flush_cache").status_code == 200
        stats = _rank_stats(c)
        assert stats[0] == stats[1], stats
        assert {k: stats[0][k] for k in ("protected_pages", "evictable_pages", "private_pages")} == {
            "protected_pages": 0,
            "evictable_pages": 0,
            "private_pages": 0,
        }
        assert stats[0]["free_pages"] == stats[0]["total_pages"], stats
