"""``--request-log``: the real engine writes one line per finished request, in token or hash form, and
``radixrt profile``'s replay of that log at the engine's own pool size gives the hit rate the engine reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import close_engine, make_engine, wait_idle

from radixrt.runtime.profile.logs import read_request_log
from radixrt.runtime.profile.replay import replay
from radixrt.runtime.scheduler.request_log import page_hashes

P = 16


def workload(passage_ids: list[int]) -> list[list[int]]:
    """Two rounds of 4 prompts sharing a 96-token head, each with its own 20-token tail."""
    head = passage_ids[:96]
    return [head + passage_ids[200 + 20 * i : 220 + 20 * i] for i in range(4)]


@pytest.mark.parametrize("hashed", [False, True], ids=["ids", "hash"])
def test_request_log_lines_and_replay(tmp_path: Path, passage_ids: list[int], hashed: bool) -> None:
    path = tmp_path / "req.jsonl"
    e = make_engine(max_total_tokens=4096, request_log=str(path), request_log_hash=hashed)
    try:
        prompts = workload(passage_ids)
        sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        outs = [e.generate(input_ids=prompts[0], sampling_params=sp)]  # warms the head
        outs += e.generate(input_ids=prompts[1:], sampling_params=sp)  # three at once
        outs.append(e.generate(input_ids=prompts[0] + [11, 12, 13], sampling_params=sp))
        wait_idle(e)
        info = e.get_server_info()["cache"]
    finally:
        close_engine(e)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(outs) == 5
    sent = prompts + [prompts[0] + [11, 12, 13]]
    by_rid = {o["meta_info"]["id"]: (o, p) for o, p in zip(outs, sent)}  # generate keeps the input order
    for rec in lines:
        o, prompt = by_rid[rec["rid"]]
        assert rec["prompt_len"] == len(prompt) and (hashed or rec["prompt_ids"] == prompt)
        assert rec["output_len"] == 6 and rec["finish_reason"] == "length"
        assert rec["cached_tokens"] == o["meta_info"]["cached_tokens"]
        assert rec["cacheable_len"] == len(prompt) - 1 and rec["cache_salt"] is None
        assert rec["arrival"] <= rec["admit"] <= rec["prefill_done"] <= rec["finish"]
        assert rec["ttft"] == pytest.approx(rec["prefill_done"] - rec["arrival"])
        assert rec["prefill_chunks"][-1][1] == len(prompt)
        if hashed:
            assert "prompt_ids" not in rec and rec["page_size"] == P
            assert rec["page_hashes"] == page_hashes(prompt + o["output_ids"], P)
        else:
            assert rec["output_ids"] == o["output_ids"]
    assert sum(r["cached_tokens"] for r in lines) == info["hit_tokens"]
    assert sum(r["prompt_len"] for r in lines) == info["query_tokens"]
    live = info["hit_tokens"] / info["query_tokens"]
    res = replay(read_request_log(str(path)), info["total_pages"], P, "gdsf")
    assert (res.hit_tokens, res.query_tokens) == (info["hit_tokens"], info["query_tokens"]), (res, live)
