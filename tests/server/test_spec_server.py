"""Speculative decoding over a real server (issue 27): the same text streamed and not, with speculation on
as the engine without it; acceptance in /get_server_info and /metrics under SGLang's and vLLM's names."""

from __future__ import annotations

from server_util import sse_events, start_server

from conftest import close_engine, make_engine

PROMPT = (
    '<|im_start|>user\nCopy this twice: {"tool": "read_file", "args": {"path": "src/app/main.py"}}'
    "<|im_end|>\n<|im_start|>assistant\n"
)
SP = {"temperature": 0, "max_new_tokens": 40}


def test_spec_server_stream_info_and_metrics():
    ref = make_engine(speculative_algorithm="none")  # the oracle does not speculate (the default would)
    try:
        want = ref.generate(PROMPT, SP)
    finally:
        close_engine(ref)
    # drafts that do not depend on the wall clock: no cost model (it times the steps), the draft length pinned
    s = start_server(
        "--speculative-algorithm",
        "suffix",
        "--no-speculative-adaptive",
        "--speculative-num-draft-tokens",
        "24",
        "--enable-metrics",
    )
    try:
        with s.client() as c:
            r = c.post("/generate", json={"text": PROMPT, "sampling_params": SP})
            assert r.status_code == 200, r.text
            assert (r.json()["output_ids"], r.json()["text"]) == (want["output_ids"], want["text"])
            with c.stream("POST", "/generate", json={"text": PROMPT, "sampling_params": SP, "stream": True}) as r:
                events = [e for e in sse_events(r.iter_lines()) if e != "[DONE]"]
            assert (events[-1]["output_ids"], events[-1]["text"]) == (want["output_ids"], want["text"])
            st = c.get("/get_server_info").json()["cache"]["speculative"]
            assert st["algorithm"] == "suffix" and st["accepted_tokens"] > 0 and st["accept_length"] > 1
            text = c.get("/metrics").text
        from prometheus_client.parser import text_string_to_metric_families

        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["sglang:spec_accept_length"].samples[0].value == st["accept_length"]
        acc = fams["vllm:spec_decode_num_accepted_tokens"].samples[0]
        assert acc.name == "vllm:spec_decode_num_accepted_tokens_total" and acc.value == st["accepted_tokens"]
        s.wait_idle()
    finally:
        rc = s.stop()  # raises if anything of its process group survives
    assert rc == 0, s.logs()
