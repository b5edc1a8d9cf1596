"""`radixrt serve` (issue 4): a real server process, talked to with the `openai` package, httpx and a ZMQ
DEALER. Greedy outputs of SmolLM2-135M-Instruct are asserted exactly."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from server_util import CONTEXT, dsl_call, dsl_recv, dsl_send, dsl_socket, sse_events, start_server

MODEL = "SmolLM2-135M-Instruct"
P = 16  # page size
FRANCE = "The capital of France is"
FRANCE_IDS = [504, 3575, 282, 4649, 314]
FRANCE_OUT = [7042, 30, 198, 198, 504, 2988, 314, 42]  # " Paris.\n\nThe answer is:"
FRANCE_TEXT = " Paris.\n\nThe answer is:"
GREEDY = {"temperature": 0}
API_KEY = "sekrit-test-key"


@pytest.fixture(scope="session")
def server(api_server):
    """The plain server: conftest's ``api_server`` (the same flags), one process group for the session."""
    return api_server


@pytest.fixture(scope="session")
def auth_server():
    s = start_server("--enable-metrics", api_key=API_KEY)
    yield s
    s.stop()  # raises if anything of its process group survives
    assert not s.group_alive()


@pytest.fixture
def doomed_server():
    """A server of its own for a test that kills its scheduler (--max-restarts 0: a dead child stays dead),
    so no other test meets a dead server, whatever the order."""
    s = start_server("--max-restarts", "0", api_key=API_KEY)
    try:
        yield s
    finally:
        s.stop()  # raises if anything of its process group survives
    assert not s.group_alive()


@pytest.fixture(autouse=True)
def _server_pool(request):
    """After each test on the shared server: idle, and free + evictable + protected == total, none protected."""
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").wait_idle()


@pytest.fixture(scope="session")
def http(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def gen(http, **body) -> dict:
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def assert_400(r: httpx.Response, param) -> dict:
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert err["message"]
    return err


def normal_request_ok(http) -> None:
    r = http.post("/v1/completions", json={"prompt": FRANCE, "max_tokens": 1, **GREEDY})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == " Paris"


# ---- start-up and CLI ------------------------------------------------------------------------------------
def test_startup_line_and_health(server, http):
    lines = server.stdout_lines()
    assert len(lines) == 1, lines
    assert re.fullmatch(
        rf"radixrt ready: http://127\.0\.0\.1:{server.port} \(zmq tcp://127\.0\.0\.1:{server.zmq_port}\) "
        rf"model={MODEL}",
        lines[0],
    ), lines
    assert 503 in server.health_codes  # /health said 503 while the model was loading
    assert http.get("/health").status_code == 200
    r = http.head("/health")  # load balancers probe with HEAD
    assert r.status_code == 200 and r.content == b""
    assert http.get("/health_generate").json() == {"status": "ok"}


@pytest.mark.parametrize(
    "cmd",
    [
        [sys.executable, "-m", "radixrt.runtime.server.launch"],
        [sys.executable, "-m", "radixrt"],
        [str(Path(sys.executable).parent / "radixrt")],
    ],
    ids=["launch", "module", "script"],
)
def test_cli_help(cmd):
    assert Path(cmd[0]).exists(), f"{cmd[0]} missing: `pip install -e .` installs the radixrt console script"
    out = subprocess.run(cmd + ["serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in (
        "--page-size",
        "--max-total-tokens",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--schedule-policy",
        "--disable-radix-cache",
        "--grammar-backend",
        "--api-key",
        "--enable-metrics",
        "--log-level",
        "--zmq-port",
        "--host",
        "--port",
    ):
        assert flag in out.stdout


# ---- OpenAI API with the official client -------------------------------------------------------------------
def test_openai_chat_and_usage(oai, http, tokenizer):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    ids = chat_ids(tokenizer, msgs)
    ref = gen(http, input_ids=ids, sampling_params={"max_new_tokens": 8, **GREEDY})
    http.post("/flush_cache")
    r = oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert c.message.content == ref["text"]
    assert c.finish_reason == ref["meta_info"]["finish_reason"]["type"]
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (
        len(ids),
        len(ref["output_ids"]),
        len(ids) + len(ref["output_ids"]),
    )
    assert u.prompt_tokens_details.cached_tokens == 0  # flushed
    r2 = oai.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=8, temperature=0)
    assert r2.choices[0].message.content == ref["text"]
    # The whole prompt is cached now except its last token; hits are whole pages.
    assert r2.usage.prompt_tokens_details.cached_tokens == (len(ids) - 1) // P * P


def test_openai_completions(oai, http):
    r = oai.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == FRANCE_TEXT
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 8, 13)
    r = oai.completions.create(model=MODEL, prompt=FRANCE_IDS, max_tokens=8, temperature=0)
    assert r.choices[0].text == FRANCE_TEXT
    r = oai.completions.create(model=MODEL, prompt=[FRANCE, "Water boils at"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [" Paris.\n\n", " 100"]
    assert r.usage.prompt_tokens == 5 + 3 and r.usage.completion_tokens == 8
    r = oai.completions.create(model=MODEL, prompt=[FRANCE_IDS, FRANCE_IDS[:3]], max_tokens=2, temperature=0)
    assert len(r.choices) == 2 and r.choices[0].text == " Paris."
    # stop strings and echo
    r = oai.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8, temperature=0, stop=["\n"])
    assert r.choices[0].text == " Paris." and r.choices[0].finish_reason == "stop"
    r = oai.completions.create(model=MODEL, prompt=FRANCE, max_tokens=2, temperature=0, echo=True)
    assert r.choices[0].text == FRANCE + " Paris."


def test_openai_n2_and_seeds(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], n=2, max_tokens=6, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens < r.usage.total_tokens - 11  # the prompt counts once
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1.0, n=2, seed=1234)
    a, b = oai.completions.create(**kw), oai.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # seeds make it reproducible
    assert [c.index for c in a.choices] == [0, 1]


def test_openai_streaming(oai):
    msgs = [{"role": "user", "content": "Say hi"}]
    full = oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    chunks = list(
        oai.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # completions, n=2
    chunks = list(oai.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8, temperature=0, n=2, stream=True))
    for i in range(2):
        assert "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) == FRANCE_TEXT
        assert [c.choices[0].finish_reason for c in chunks if c.choices[0].index == i][-1] == "length"


def test_openai_logprobs(oai, http):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert bytes(e.bytes).decode() == e.token
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    r = oai.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == FRANCE_TEXT
    assert lp.text_offset == [0, 6, 7, 8, 9, 12, 19, 22]
    ref = gen(http, text=FRANCE, sampling_params={"max_new_tokens": 8, **GREEDY}, return_logprob=True)
    ref_lps = [x[0] for x in ref["meta_info"]["output_token_logprobs"]]
    assert [x[1] for x in ref["meta_info"]["output_token_logprobs"]] == FRANCE_OUT
    assert lp.token_logprobs == pytest.approx(ref_lps, abs=1e-4)
    assert all(
        len(d) == 2 and max(d.values()) == pytest.approx(v, abs=1e-6)
        for d, v in zip(lp.top_logprobs, lp.token_logprobs)
    )


def test_models_route(oai):
    models = oai.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model"
    assert oai.models.retrieve(MODEL).id == MODEL
    import openai

    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("gpt-4")


# ---- SGLang-native API -----------------------------------------------------------------------------------
def test_native_generate(http):
    out = gen(http, text=FRANCE, sampling_params={"max_new_tokens": 8, **GREEDY})
    assert set(out) == {"text", "output_ids", "meta_info"}
    assert out["output_ids"] == FRANCE_OUT and out["text"] == FRANCE_TEXT
    m = out["meta_info"]
    assert (m["prompt_tokens"], m["completion_tokens"]) == (5, 8)
    assert m["finish_reason"] == {"type": "length", "length": 8}
    outs = gen(http, input_ids=[FRANCE_IDS, FRANCE_IDS[:4]], sampling_params={"max_new_tokens": 8, **GREEDY})
    assert isinstance(outs, list) and outs[0]["output_ids"] == FRANCE_OUT
    assert gen(http, text=[FRANCE], sampling_params={"max_new_tokens": 2, **GREEDY})[0]["text"] == " Paris."
    # any content type (curl's default form type included) is read as JSON
    r = http.post(
        "/generate",
        content=json.dumps({"text": FRANCE, "sampling_params": {"max_new_tokens": 2, **GREEDY}}),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.json()["text"] == " Paris."
    r = http.post("/v1/completions", content=json.dumps({"prompt": FRANCE, "max_tokens": 2, **GREEDY}))
    assert r.json()["choices"][0]["text"] == " Paris."
    # prefill only
    out = gen(
        http,
        input_ids=FRANCE_IDS,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
        return_text_in_logprobs=True,
        top_logprobs_num=2,
    )
    assert out["output_ids"] == [] and out["text"] == ""
    itl = out["meta_info"]["input_token_logprobs"]
    assert len(itl) == 5 and itl[0] is None
    assert [x[1] for x in itl[1:]] == FRANCE_IDS[1:]
    assert [x[2] for x in itl[1:]] == [" capital", " of", " France", " is"]
    assert all(x[0] < 0 for x in itl[1:])
    # logprobs with the output
    out = gen(
        http,
        text=FRANCE,
        sampling_params={"max_new_tokens": 2, **GREEDY},
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    otl = out["meta_info"]["output_token_logprobs"]
    assert [(x[1], x[2]) for x in otl] == [(7042, " Paris"), (30, ".")]
    assert [t[0][1] for t in out["meta_info"]["output_top_logprobs"]] == [7042, 30]


def test_native_stream(http):
    events = []
    with http.stream(
        "POST", "/generate", json={"text": FRANCE, "sampling_params": {"max_new_tokens": 8, **GREEDY}, "stream": True}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    objs = events[:-1]
    texts = [o["text"] for o in objs]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))  # cumulative
    assert texts[-1] == FRANCE_TEXT and objs[-1]["output_ids"] == FRANCE_OUT
    assert objs[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(o["meta_info"]["finish_reason"] is None for o in objs[:-1])


def test_native_flush_info_model(http, server):
    # start from an empty tree, whatever ran before: 40 prompt tokens + 2 sampled, of which the last has
    # no KV yet, leave 41 computed tokens = 2 full pages in the tree
    assert http.post("/flush_cache").json()["success"] is True
    gen(http, input_ids=FRANCE_IDS * 8, sampling_params={"max_new_tokens": 2, "ignore_eos": True, **GREEDY})
    info = http.get("/get_server_info").json()
    assert info["port"] == server.port and info["context_length"] == CONTEXT and "api_key" not in info
    assert info["max_total_tokens"] == 8192 and info["model_name"] == MODEL
    assert info["cache"]["total_pages"] == 8192 // P and info["cache"]["evictable_pages"] == (40 + 2 - 1) // P
    assert set(info["process_ids"]) == {"main", "scheduler", "detokenizer"}
    assert http.post("/flush_cache").json() == {"success": True, "message": "Cache flushed."}
    c = http.get("/get_server_info").json()["cache"]
    assert c["evictable_pages"] == 0 and c["free_pages"] == c["total_pages"]
    mi = http.get("/get_model_info").json()
    assert set(mi) == {"model_path", "tokenizer_path", "is_generation"} and mi["is_generation"] is True
    assert mi["model_path"].endswith(".gguf")


# ---- the DSL socket ------------------------------------------------------------------------------------------
def test_dsl_socket(server, http):
    s = dsl_socket(server.zmq_url)
    try:
        [r] = dsl_call(s, "m1", "get_model_info")
        assert r.event == "result" and r.data == http.get("/get_model_info").json()
        [r] = dsl_call(s, "i1", "get_server_info")
        assert r.event == "result" and r.data["model_name"] == MODEL and "cache" in r.data
        [r] = dsl_call(s, "g1", "generate", {"text": FRANCE, "sampling_params": {"max_new_tokens": 8, **GREEDY}})
        assert r.event == "result" and r.data["output_ids"] == FRANCE_OUT and r.data["text"] == FRANCE_TEXT
        [r] = dsl_call(
            s,
            "g2",
            "generate",
            {"input_ids": [FRANCE_IDS, FRANCE_IDS], "sampling_params": {"max_new_tokens": 2, **GREEDY}},
        )
        assert [o["text"] for o in r.data] == [" Paris.", " Paris."]
        replies = dsl_call(
            s,
            "g3",
            "generate",
            {
                "text": FRANCE,
                "stream": True,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 8, **GREEDY},
            },
        )
        assert [x.event for x in replies] == ["chunk"] * (len(replies) - 1) + ["result"]
        assert len(replies) >= 2
        texts = [x.data["text"] for x in replies]
        assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
        assert replies[-1].data["text"] == FRANCE_TEXT
        assert len(replies[-1].data["meta_info"]["output_token_logprobs"]) == 8
        # abort a long streamed generation after its first chunk
        dsl_send(
            s,
            "g4",
            "generate",
            {
                "text": FRANCE,
                "stream": True,
                "rid": "dsl-abort-me",
                "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, **GREEDY},
            },
        )
        first = dsl_recv(s)
        assert first.req_id == "g4" and first.event == "chunk"
        dsl_send(s, "a1", "abort", {"rid": "dsl-abort-me"})
        seen = {}
        while "a1" not in seen or "g4" not in seen:
            r = dsl_recv(s)
            if r.event in ("result", "error"):
                seen[r.req_id] = r
        assert seen["a1"].data == {"success": True}
        assert seen["g4"].event == "result"
        assert seen["g4"].data["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(seen["g4"].data["output_ids"]) < 200
        server.wait_idle()
        [r] = dsl_call(s, "f1", "flush_cache")
        assert r.event == "result" and r.data["success"] is True
        # errors
        [r] = dsl_call(s, "e1", "generate", {"text": FRANCE, "sampling_params": {"max_new_tokens": -1}})
        assert r.event == "error" and r.data["type"] == "invalid_request_error" and r.data["param"] == "max_new_tokens"
        assert set(r.data) == {"message", "type", "param", "code"}
        [r] = dsl_call(s, "e2", "dance")
        assert r.event == "error" and r.data["param"] == "op"
        [r] = dsl_call(s, "e3", "generate", {"input_ids": [], "sampling_params": {}})
        assert r.event == "error" and r.data["param"] == "input_ids"
        s.send(b"not msgpack")
        r = dsl_recv(s)
        assert r.event == "error" and r.req_id == ""
        [r] = dsl_call(s, "g5", "generate", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1, **GREEDY}})
        assert r.data["text"] == " Paris"
    finally:
        s.close(linger=0)


# ---- validation ----------------------------------------------------------------------------------------------
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SCHEMA_BAD_PATTERN = {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}}
# accepted by the checks before queueing; the grammar backend meets its limits only once it runs (a 400 all
# the same, from the scheduler, naming the field the grammar came from)
HUGE_REGEX = "a{99999999}"
SCHEMA_HUGE_PATTERN = {"type": "string", "pattern": "^a{99999999}$"}
DEEP_SCHEMA = json.loads('{"type":"object","properties":{"a":' * 100 + '{"type":"integer"}' + "}}" * 100)
BAD = [
    # second break-test round: each was a 200 or a 500
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1, "json_schema": DEEP_SCHEMA}}, "json_schema"),
    ("chat", {**CHAT, "json_schema": {}}, "json_schema"),
    ("comp", {"prompt": FRANCE, "max_tokens": 1, "max_new_tokens": 0}, "max_new_tokens"),
    ("chat", {**CHAT, "session_params": {}}, "session_params"),
    ("gen", {"text": ["hi"] * 1025, "sampling_params": {"max_new_tokens": 1}}, "text"),
    ("gen", {"input_ids": [5] * CONTEXT}, "input_ids"),
    ("gen", {"text": ["a", "b"], "rid": ["x", "x"]}, "rid"),
    ("chat", {**CHAT, "model": "gpt-4"}, "model"),
    ("chat", {**CHAT, "max_tokens": -1}, "max_tokens"),
    ("chat", {**CHAT, "max_tokens": 10**6}, "max_tokens"),
    ("chat", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {**CHAT, "n": 0}, "n"),
    # third break-test round (a fresh newcomer): OpenAI and vLLM refuse stream_options without stream
    ("chat", {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("comp", {"prompt": "hi", "max_tokens": 2, "stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {**CHAT, "messages": []}, "messages"),
    (
        "chat",
        {**CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "18C"}]},
        "messages[1].tool_call_id",
    ),
    (
        "chat",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_9", "content": "18C"},
            ],
        },
        "messages[1].tool_call_id",
    ),
    (
        "chat",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]},
            ],
        },
        "messages[1].tool_calls[0]",
    ),
    (
        "chat",
        {
            **CHAT,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1"},
            ],
        },
        "messages[2].content",
    ),
    ("chat", {"max_tokens": 2}, "messages"),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {**CHAT, "temperature": "hot"}, "temperature"),
    ("chat", {**CHAT, "temperature": -1}, "temperature"),
    ("chat", {**CHAT, "top_p": 0}, "top_p"),
    (
        "chat",
        {**CHAT, "tools": [{"type": "function", "function": {"description": "no name"}}]},
        "tools[0].function.name",
    ),
    ("chat", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        "chat",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
    ),
    (
        "chat",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}},
        "response_format.json_schema.schema",
    ),
    (
        "chat",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
        "response_format.json_schema.schema",
    ),
    ("chat", {**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
    ("chat", {**CHAT, "response_format": "json"}, "response_format"),
    ("chat", {**CHAT, "regex": "("}, "regex"),
    ("chat", {**CHAT, "regex": HUGE_REGEX}, "regex"),
    ("chat", {**CHAT, "reasoning_effort": "ultra"}, "reasoning_effort"),
    (
        "chat",
        {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_HUGE_PATTERN}},
        },
        "response_format.json_schema.schema",
    ),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": {"name": "f\n"}}]}, "tools[0].function.name"),
    (
        "chat",
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
    ),
    (
        "chat",
        {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_BAD_PATTERN}},
        },
        "response_format.json_schema.schema",
    ),
    ("comp", {"prompt": FRANCE, "logprobs": 6}, "logprobs"),
    ("comp", {"prompt": [1] * 300, "max_tokens": 1}, "prompt"),
    ("comp", {"prompt": [], "max_tokens": 1}, "prompt"),
    ("comp", {"prompt": [10**7], "max_tokens": 1}, "prompt"),
    ("comp", {"prompt": FRANCE, "max_tokens": 1, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("gen", {"sampling_params": {"max_new_tokens": 1}}, "text"),
    ("gen", {"text": FRANCE, "input_ids": FRANCE_IDS}, "text"),
    ("gen", {"input_ids": [10**7]}, "input_ids"),
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_token": 1}}, "sampling_params"),
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("gen", {"text": FRANCE, "sampling_params": {"regex": "("}}, "regex"),
    ("gen", {"text": FRANCE, "sampling_params": {"regex": HUGE_REGEX, "max_new_tokens": 4}}, "regex"),
    ("gen", {"text": FRANCE, "sampling_params": {"ebnf": 'root ::= "a" root', "max_new_tokens": 4}}, "ebnf"),
    ("gen", {"text": FRANCE, "top_logprobs_num": 99, "return_logprob": True}, "top_logprobs_num"),
    ("gen", {"text": FRANCE, "bogus": 1}, "bogus"),
    ("gen", {"text": [FRANCE, FRANCE], "stream": True}, "stream"),
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_tokens": "4"}}, "max_new_tokens"),
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1, "seed": 2**64}}, "seed"),
    ("gen", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1, "stop_token_ids": [10**9]}}, "stop_token_ids"),
    # strict types on the OpenAI routes, as on /generate; OpenAI's documented ranges
    ("comp", {"prompt": FRANCE, "max_tokens": "2"}, "max_tokens"),
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    ("comp", {"prompt": FRANCE, "max_tokens": 1, "temperature": 3}, "temperature"),
    ("comp", {"prompt": FRANCE, "max_tokens": 1, "presence_penalty": -2.5}, "presence_penalty"),
]
ROUTES = {"chat": "/v1/chat/completions", "comp": "/v1/completions", "gen": "/generate"}


def test_bad_requests_are_400(http):
    for route, body, param in BAD:
        err = assert_400(http.post(ROUTES[route], json=body), param)
        if body.get("max_tokens") == 10**6:
            assert "1000000" in err["message"] and str(CONTEXT) in err["message"]
        if body.get("prompt") == [1] * 300:
            assert "300" in err["message"] and str(CONTEXT) in err["message"]
        normal_request_ok(http)
        if "a{99999999}" in json.dumps(body):  # one line in the caller's field names, not the backend's state dump
            assert err["message"].startswith(f"{param}: the grammar cannot be used: "), err
            assert "<state>" not in err["message"] and "\n" not in err["message"], err
    r = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_400(r, None)
    r = http.post("/generate", content=b"{not json")
    assert_400(r, None)
    for route in ("/generate", "/v1/chat/completions"):  # lone surrogate: msgspec says "truncated"
        err = assert_400(
            http.post(route, content=b'{"text": "\\ud800", "messages": [{"role": "user", "content": "\\ud800"}]}'), None
        )
        assert "lone UTF-16 surrogate" in err["message"], err
        err = assert_400(http.post(route, content=b'{"text": "a", "temperature": NaN}'), None)
        assert "not valid JSON" in err["message"] and "surrogate" not in err["message"], err
        err = assert_400(http.post(route, content=b'{"text": "a", "temperature": 1e400}'), None)
        assert "Number out of range" in err["message"] and "surrogate" not in err["message"], err
        body = '{"text": "a", "messages": [{"role": "user", "content": "a"}]}'
        for raw, why in (
            (b"\xef\xbb\xbf" + body.encode(), "the body starts with a UTF-8 byte-order mark"),
            (body.encode("utf-16"), "the body is not UTF-8"),
            (body.encode("utf-16-le"), "the body is not UTF-8"),
            (body.encode("utf-32"), "the body is not UTF-8"),
        ):
            err = assert_400(http.post(route, content=raw), None)
            assert err["message"].startswith("the request body is not valid JSON: " + why), err
    normal_request_ok(http)
    t = time.perf_counter()  # a 10 MB body is over the 8 MiB body limit: 413 before any parsing
    r = http.post("/v1/completions", json={"prompt": "word " * 2_000_000, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert time.perf_counter() - t < 2
    t = time.perf_counter()
    err = assert_400(
        http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi " * 2_000_000}], "max_tokens": 1}
        ),
        "messages",
    )
    assert time.perf_counter() - t < 2 and "6000000 characters" in err["message"], err
    err = assert_400(http.post("/v1/chat/completions", json={**CHAT, "min_tokens": 5}), "min_tokens")
    assert err["message"] == "min_tokens (5) must be <= max_tokens (2)"
    deep = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for route in ("/generate", "/v1/completions"):
        assert "nested too deeply" in assert_400(http.post(route, content=deep), None)["message"]
    err = assert_400(
        http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "guided_choice": [""]}
        ),
        "guided_choice",
    )
    assert err["message"] == "guided_choice[0]: must not be empty"
    # a field of several accepted types names them, and the closest one's failure (break-test: it said
    # "Input should be a valid string" for token ids 1.5)
    err = assert_400(http.post("/v1/completions", json={"prompt": [1.5, 2], "max_tokens": 1}), "prompt")
    assert err["message"] == (
        "prompt: must be one of str, list[str], list[int], list[list[int]]; as list[int], "
        "[0]: Input should be a valid integer"
    ), err
    normal_request_ok(http)


HUGE_FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_HUGE_PATTERN}}
# refused by the scheduler before the first token: streamed, still a 400 (the status line waits for the first
# output), not a 200 carrying an error event
STREAMED_REFUSALS = [
    (
        "/generate",
        {"text": FRANCE, "stream": True, "sampling_params": {"regex": HUGE_REGEX, "max_new_tokens": 4}},
        "regex",
    ),
    ("/v1/completions", {"prompt": FRANCE, "max_tokens": 4, "stream": True, "regex": HUGE_REGEX}, "regex"),
    (
        "/v1/chat/completions",
        {**CHAT, "stream": True, "response_format": HUGE_FORMAT},
        "response_format.json_schema.schema",
    ),
    (
        "/v1/responses",
        {
            "input": "hi",
            "stream": True,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA_HUGE_PATTERN}},
        },
        "text.format.schema",
    ),
]


def test_streamed_refusals_are_400_before_any_event(http):
    for route, body, param in STREAMED_REFUSALS:
        with http.stream("POST", route, json=body) as r:
            r.read()
            assert r.headers["content-type"].startswith("application/json"), (route, r.headers, r.text)
            err = assert_400(r, param)
        assert err["message"].startswith(f"{param}: the grammar cannot be used: "), err
        normal_request_ok(http)
    body = {**STREAMED_REFUSALS[-1][1], "stream": False}  # not streamed: the stored session is closed again
    assert_400(http.post("/v1/responses", json=body), "text.format.schema")
    tool = {
        "name": "f",
        "input_schema": {"type": "object", "properties": {"x": SCHEMA_HUGE_PATTERN}, "required": ["x"]},
    }
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    for stream in (False, True):
        r = http.post("/v1/messages", json={**body, "tool_choice": {"type": "tool", "name": "f"}, "stream": stream})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error", r.text
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, **GREEDY}) as r:  # unchanged
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_tool_choice_none_ignores_tools(http):
    r = http.post(
        "/v1/chat/completions",
        json={**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none", **GREEDY},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    msg = r.json()["choices"][0]["message"]
    assert not msg.get("tool_calls") and isinstance(msg["content"], str) and msg["content"]
    # streamed: no chunk carries a tool call, and the text is the unstreamed one
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={
            **CHAT,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "none",
            "stream": True,
            **GREEDY,
        },
    ) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == msg["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] in ("stop", "length")


# ---- edge cases 4-7 through HTTP --------------------------------------------------------------------------------
def test_edge4_empty_prompt(http):
    assert_400(http.post("/v1/completions", json={"prompt": "", "max_tokens": 2}), "prompt")
    assert_400(http.post("/v1/completions", json={"prompt": [""], "max_tokens": 2}), "prompt")
    assert_400(http.post("/generate", json={"input_ids": []}), "input_ids")
    assert_400(http.post("/generate", json={"text": ""}), "text")
    r = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": ""}], "max_tokens": 8, **GREEDY}
    )
    assert r.status_code == 200  # the template makes the prompt non-empty: a valid generation
    assert r.json()["choices"][0]["message"]["content"] == "I'm here to help you with whatever"
    assert r.json()["usage"]["completion_tokens"] == 8
    normal_request_ok(http)


def test_edge5_context_boundary(http, passage_ids):
    C = CONTEXT
    for n in (C - 2, C - 1, C, C + 1):
        ids = passage_ids[:n]
        for mt in (1, 16, None):
            body = {"prompt": ids, "ignore_eos": True, **GREEDY}
            if mt is not None:
                body["max_tokens"] = mt
            r = http.post("/v1/completions", json=body)
            fits = n < C and (mt is None or n + mt <= C)
            if fits:
                assert r.status_code == 200, (n, mt, r.text)
                u = r.json()["usage"]
                assert u["prompt_tokens"] == n
                assert u["completion_tokens"] == (mt if mt is not None else C - n)  # omitted: the room left
                assert r.json()["choices"][0]["finish_reason"] == "length"
            else:
                err = assert_400(r, "prompt" if n >= C else "max_tokens")
                assert str(n) in err["message"] and str(C) in err["message"], err
    # the same through chat: a conversation that leaves no room
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 300}]})
    err = assert_400(r, "messages")
    assert str(C) in err["message"]
    normal_request_ok(http)


COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
STOP = " 14, 15"  # 7 tokens: " ", "1", "4", ",", " ", "1", "5"


def stream_completion(http, body) -> tuple[list[str], list]:
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return [e["choices"][0]["text"] for e in events[:-1]], [e["choices"][0]["finish_reason"] for e in events[:-1]]


def test_edge6_multi_token_stop_string(http, tokenizer):
    assert len(tokenizer.encode(STOP, add_special_tokens=False)) >= 3
    body = {"prompt": COUNT, "max_tokens": 24, "stop": [STOP], **GREEDY}
    full = http.post("/v1/completions", json=body).json()["choices"][0]
    assert full["text"] == " 11, 12, 13," and full["finish_reason"] == "stop"
    deltas, finishes = stream_completion(http, body)
    assert "".join(deltas) == full["text"]
    assert finishes[-1] == "stop"
    acc = ""
    for d in deltas:
        acc += d
        assert STOP not in acc
        assert not any(acc.endswith(STOP[:k]) for k in range(2, len(STOP))), acc  # held back until it fails
    # chat, streamed and not: same text
    msgs = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    stop = "\n4. 4"  # 5 tokens
    cbody = {"messages": msgs, "max_tokens": 24, "stop": [stop], **GREEDY}
    full = http.post("/v1/chat/completions", json=cbody).json()["choices"][0]
    assert full["message"]["content"] == "1. 1\n2. 2\n3. 3" and full["finish_reason"] == "stop"
    with http.stream("POST", "/v1/chat/completions", json={**cbody, "stream": True}) as r:
        ev = sse_events(r.iter_lines())[:-1]
    deltas = [e["choices"][0]["delta"].get("content", "") for e in ev]
    assert "".join(deltas) == full["message"]["content"]
    assert ev[-1]["choices"][0]["finish_reason"] == "stop"
    acc = ""
    for d in deltas:
        acc += d
        assert not any(acc.endswith(stop[:k]) for k in range(2, len(stop))), acc


CJK = "Repeat: 你好，世界！😀🎉 Repeat: 你好，世界！😀🎉 Repeat:"
CJK_OUT = [" ", " ", " 你", " 你", " 你好", " 你好，"]


def test_edge7_multibyte(http):
    for mt in range(1, 7):
        body = {"prompt": CJK, "max_tokens": mt, **GREEDY}
        full = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
        deltas, _ = stream_completion(http, body)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == full == CJK_OUT[mt - 1]
    body = {"prompt": CJK, "max_tokens": 12, "stop": ["界"], **GREEDY}
    full = http.post("/v1/completions", json=body).json()["choices"][0]
    deltas, finishes = stream_completion(http, body)
    assert full["text"] == " 你好，世" and full["finish_reason"] == "stop"
    assert "".join(deltas) == full["text"] and finishes[-1] == "stop"
    assert all("\ufffd" not in d for d in deltas)
    # native stream too
    with http.stream(
        "POST", "/generate", json={"text": CJK, "stream": True, "sampling_params": {"max_new_tokens": 5, **GREEDY}}
    ) as r:
        objs = sse_events(r.iter_lines())[:-1]
    assert all("\ufffd" not in o["text"] for o in objs) and objs[-1]["text"] == " 你好"


# ---- reliability --------------------------------------------------------------------------------------------------
def raw_stream_then_close(server, body: dict) -> bytes:
    """Send a streaming request over a raw socket, read up to the first SSE chunk, then close."""
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    s.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    buf = b""
    while b"data:" not in buf or not buf.rstrip().endswith(b"}"):
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    s.close()
    return buf


def test_client_gone_mid_body_is_not_an_error(server, http):
    """A client that closes before its body is complete is answered nothing and logged as no error."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"te'
        )
    time.sleep(0.5)
    normal_request_ok(http)
    err = Path(server.err_path).read_text()
    assert "ClientDisconnect" not in err and "internal error" not in err, err[-2000:]


def test_disconnect_aborts_and_frees_pages(server, http, passage_ids):
    """Edge case 3 over HTTP: a client that leaves mid-stream (or mid-wait) aborts its request."""
    prompt = passage_ids[:50]  # four pages
    sp = {"max_new_tokens": 6, **GREEDY}
    long = {"max_new_tokens": 200, "ignore_eos": True, **GREEDY}
    http.post("/flush_cache")
    cold = gen(http, input_ids=prompt, sampling_params=sp)["output_ids"]
    for i in range(4):
        assert http.post("/flush_cache").json()["success"]
        if i < 3:
            buf = raw_stream_then_close(server, {"input_ids": prompt, "stream": True, "sampling_params": long})
            assert buf.startswith(b"HTTP/1.1 200")
        else:  # not streamed: the client gives up while waiting
            payload = json.dumps({"input_ids": prompt, "sampling_params": long}).encode()
            s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            s.sendall(
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            # gone once the request runs (its prompt prefilled: info is answered between steps)
            deadline = time.monotonic() + 60
            while http.get("/get_server_info").json()["num_running"] == 0:
                assert time.monotonic() < deadline, "the request never ran"
                time.sleep(0.01)
            s.close()
        st = server.wait_idle(timeout=60)
        assert st["free_pages"] + st["evictable_pages"] == st["total_pages"]
        # What the aborted request computed went to the tree: far fewer than 50 + 200 tokens, so it was
        # stopped early, not run to completion.
        assert 0 < st["evictable_pages"] * P < 50 + 100, st
        assert gen(http, input_ids=prompt, sampling_params=sp)["output_ids"] == cold


def test_abort_request_route(http, server):
    with http.stream(
        "POST",
        "/generate",
        json={
            "text": FRANCE,
            "stream": True,
            "rid": "http-abort-me",
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, **GREEDY},
        },
    ) as r:
        lines = r.iter_lines()
        first = next(l for l in lines if l.startswith("data:"))
        assert json.loads(first[5:])["meta_info"]["finish_reason"] is None
        assert http.post("/abort_request", json={"rid": "http-abort-me"}).json() == {"success": True}
        rest = sse_events(lines)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(rest[-2]["output_ids"]) < 200
    # an abort that arrives while its call is still validating (a grammar compiling) is kept, not lost
    import concurrent.futures

    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 61}}, "required": ["s"]}
    body = {"text": FRANCE, "rid": "abort-early", "sampling_params": {"max_new_tokens": 64, "json_schema": schema}}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(http.post, "/generate", json=body)
        # at once: it reaches the server before the call is submitted (while it validates, or even before it
        # arrives), and is kept until the call comes through
        assert http.post("/abort_request", json={"rid": "abort-early"}).json() == {"success": True}
        out = fut.result().json()
    # llguidance compiles in milliseconds, so a token or two may come before the abort lands: it is kept all the same
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 64
    # SGLang's abort_all: every request in flight ends as an abort
    long = {"text": FRANCE, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, **GREEDY}}
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        futs = [pool.submit(http.post, "/generate", json={**long, "rid": f"all-{i}"}) for i in range(2)]
        chat = pool.submit(
            http.post,
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": FRANCE}], "max_tokens": 200, "ignore_eos": True, **GREEDY},
        )
        story = "Tell a long story about a dragon and a knight."  # a long answer: still running when the abort comes
        resp = pool.submit(
            http.post, "/v1/responses", json={"input": story, "max_output_tokens": 150, "store": False, **GREEDY}
        )
        msg = pool.submit(
            http.post,
            "/v1/messages",
            json={"messages": [{"role": "user", "content": story}], "max_tokens": 150, **GREEDY},
        )
        deadline = time.monotonic() + 60
        while True:  # all five in the scheduler's hands
            info = http.get("/get_server_info").json()
            if info["num_running"] + info["num_waiting"] >= 5:
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.01)
        assert http.post("/abort_request", json={"abort_all": True}).json() == {"success": True}
        outs = [f.result().json() for f in futs]
        chat, resp, msg = chat.result().json(), resp.result().json(), msg.result().json()
    # neither says the answer is complete: Responses "incomplete" (reason abort), Messages stop_reason abort
    assert resp.get("status") == "incomplete" and resp["incomplete_details"] == {"reason": "abort"}, resp
    assert msg.get("stop_reason") == "abort" and msg["usage"]["output_tokens"] < 150, msg
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort"] * 2
    assert all(len(o["output_ids"]) < 200 for o in outs)
    # the OpenAI routes say so too (SGLang's extra finish_reason value), not "stop"
    assert chat["choices"][0]["finish_reason"] == "abort" and chat["usage"]["completion_tokens"] < 200, chat
    for body, param in (
        ({"abort_all": "yes"}, "abort_all"),
        ({}, "rid"),
        ({"rid": "x", "abort_all": True}, "abort_all"),
    ):
        r = http.post("/abort_request", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_64_concurrent_streams(server, http):
    prompts = [
        "The capital of France is",
        "Hello, my name is",
        "def fibonacci(n):",
        "The quick brown fox",
        "Once upon a time",
        "1 + 1 =",
        "Water boils at",
        "My favorite color is",
    ]
    body = lambda p: {"prompt": p, "max_tokens": 8, "ignore_eos": True, **GREEDY}
    ref = {p: http.post("/v1/completions", json=body(p)).json()["choices"][0]["text"] for p in prompts}
    assert ref[FRANCE] == FRANCE_TEXT

    async def one(client, p):
        text, finish = "", None
        async with client.stream("POST", "/v1/completions", json={**body(p), "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:") and line.strip() != "data: [DONE]":
                    c = json.loads(line[5:])["choices"][0]
                    text += c["text"]
                    finish = c["finish_reason"] or finish
        return p, text, finish

    async def main():
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as client:
            return await asyncio.gather(*[one(client, prompts[i % 8]) for i in range(64)])

    results = asyncio.run(main())
    assert len(results) == 64
    for p, text, finish in results:
        assert text == ref[p] and finish == "length"


# ---- auth and metrics (a second server) -------------------------------------------------------------------------
def test_auth(auth_server):
    url = auth_server.url
    assert httpx.get(url + "/health").status_code == 200  # no key needed
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/generate"),
        ("GET", "/get_server_info"),
        ("GET", "/metrics"),
        ("POST", "/flush_cache"),
    ):
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": API_KEY},
            {"Authorization": "Basic " + API_KEY},
        ):
            r = httpx.request(method, url + path, headers=headers, json={})
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    r = client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8, temperature=0)
    assert r.choices[0].text == FRANCE_TEXT
    # the scheme is case-insensitive (RFC 9110)
    assert httpx.get(url + "/v1/models", headers={"Authorization": "bearer " + API_KEY}).status_code == 200
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt=FRANCE, max_tokens=1)
    s = dsl_socket(auth_server.zmq_url)
    try:
        [r] = dsl_call(s, "x", "get_model_info")
        assert r.event == "error" and r.data["code"] == "invalid_api_key"
        [r] = dsl_call(s, "y", "generate", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1}}, api_key="nope")
        assert r.event == "error" and r.data["code"] == "invalid_api_key"
        [r] = dsl_call(
            s, "z", "generate", {"text": FRANCE, "sampling_params": {"max_new_tokens": 1, **GREEDY}}, api_key=API_KEY
        )
        assert r.event == "result" and r.data["text"] == " Paris"
    finally:
        s.close(linger=0)


def test_metrics(auth_server, server):
    from prometheus_client.parser import text_string_to_metric_families

    assert httpx.get(server.url + "/metrics").status_code == 404  # off without --enable-metrics
    with auth_server.client() as c:
        for _ in range(2):
            assert (
                c.post(
                    "/generate", json={"text": FRANCE, "sampling_params": {"max_new_tokens": 4, **GREEDY}}
                ).status_code
                == 200
            )
        text = c.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # the names SGLang's and vLLM's dashboards chart (docs/cache.md: metrics)
    for name in (
        "sglang:num_running_reqs",
        "vllm:num_requests_running",
        "sglang:num_queue_reqs",
        "vllm:num_requests_waiting",
        "sglang:token_usage",
        "vllm:kv_cache_usage_perc",
        "sglang:cache_hit_rate",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "sglang:cached_tokens",
        "radixrt:kv_cache_cached_ratio",
        "sglang:time_to_first_token_seconds",
        "vllm:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "vllm:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "sglang:generation_tokens",
        "vllm:generation_tokens",
        "sglang:prompt_tokens",
        "vllm:prompt_tokens",
        "sglang:num_requests",
        "vllm:request_success",
    ):
        assert name in fams, sorted(fams)

    def value(fam, sample_name, **labels):
        return next(
            s.value
            for s in fams[fam].samples
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    for p in ("sglang", "vllm"):
        assert value(f"{p}:time_to_first_token_seconds", f"{p}:time_to_first_token_seconds_count") >= 2
        assert value(f"{p}:e2e_request_latency_seconds", f"{p}:e2e_request_latency_seconds_count") >= 2
        assert value(f"{p}:inter_token_latency_seconds", f"{p}:inter_token_latency_seconds_count") >= 6
        assert value(f"{p}:generation_tokens", f"{p}:generation_tokens_total") >= 8
    assert value("sglang:num_running_reqs", "sglang:num_running_reqs") == 0
    assert value("vllm:num_requests_running", "vllm:num_requests_running") == 0
    q = value("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    assert q >= 10
    hits = value("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    assert value("sglang:cached_tokens", "sglang:cached_tokens_total") == hits
    assert value("sglang:cache_hit_rate", "sglang:cache_hit_rate") == pytest.approx(hits / q)
    assert value("sglang:num_requests", "sglang:num_requests_total") >= 2
    assert value("vllm:request_success", "vllm:request_success_total", finished_reason="length") >= 2


def test_scheduler_death_is_503(doomed_server):
    """Kills its own server's scheduler (--max-restarts 0: not restarted; test_supervisor.py has the
    restarts). Pending and new requests get errors, nothing hangs."""
    import os
    import signal

    with doomed_server.client(timeout=60) as c:
        pid = c.get("/get_server_info").json()["process_ids"]["scheduler"]
        with c.stream(
            "POST",
            "/generate",
            json={"text": FRANCE, "stream": True, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}},
        ) as r:
            lines = r.iter_lines()
            next(l for l in lines if l.startswith("data:"))
            os.kill(pid, signal.SIGKILL)
            rest = sse_events(lines)  # ends, with an error event, instead of hanging
        assert rest[-1] == "[DONE]" and "error" in rest[-2]
        assert "scheduler" in rest[-2]["error"]["message"]
        for method, path, body in (
            ("POST", "/v1/completions", {"prompt": FRANCE, "max_tokens": 1}),
            ("POST", "/generate", {"text": FRANCE}),
            ("GET", "/get_server_info", None),
            ("GET", "/health", None),
            ("GET", "/health_generate", None),
        ):
            r = c.request(method, path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert "scheduler process exited" in r.json()["error"]["message"]
    s = dsl_socket(doomed_server.zmq_url)
    try:
        [r] = dsl_call(s, "d", "generate", {"text": FRANCE}, api_key=API_KEY)
        assert r.event == "error" and r.data["type"] == "service_unavailable"
    finally:
        s.close(linger=0)


# ---- vLLM's chat template options ------------------------------------------------------------------------
CONTINUED = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]


def test_continue_final_message_and_add_generation_prompt(oai, http, tokenizer):
    opts = {"continue_final_message": True, "add_generation_prompt": False}
    r = oai.chat.completions.create(model=MODEL, messages=CONTINUED, max_tokens=6, temperature=0, extra_body=opts)
    text = tokenizer.apply_chat_template(CONTINUED, continue_final_message=True, tokenize=False)
    assert text.endswith("The capital of France is")  # inside the last turn: no end of turn, no new header
    ids = tokenizer.encode(text, add_special_tokens=False)
    g = gen(http, input_ids=ids, sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == g["text"]
    assert g["text"] == " Paris."
    r = oai.chat.completions.create(  # the conversation as it stands: no assistant header
        model=MODEL, messages=CONTINUED[:1], max_tokens=6, temperature=0, extra_body={"add_generation_prompt": False}
    )
    ids = tokenizer.encode(tokenizer.apply_chat_template(CONTINUED[:1], tokenize=False), add_special_tokens=False)
    with_header = chat_ids(tokenizer, CONTINUED[:1])
    assert r.usage.prompt_tokens == len(ids) < len(with_header) and with_header[: len(ids)] == ids
    g = gen(http, input_ids=ids, sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert r.choices[0].message.content == g["text"]
    assert g["text"] == "assistant\nThe capital"  # the model opens the turn itself (its special token skipped)
    err = assert_400(
        http.post("/v1/chat/completions", json={**CHAT, "continue_final_message": True}), "continue_final_message"
    )
    assert err["message"].startswith("continue_final_message and add_generation_prompt cannot both be true")
    body = {**CHAT, "add_generation_prompt": False, "continue_final_message": "yes"}
    assert_400(http.post("/v1/chat/completions", json=body), "continue_final_message")
    body = {**opts, "messages": CONTINUED, "max_tokens": 4, "response_format": {"type": "json_object"}}
    err = assert_400(http.post("/v1/chat/completions", json=body), "continue_final_message")
    assert err["message"].startswith("continue_final_message cannot be combined with response_format: "), err


# a property whose pattern llguidance's lexer meets only once the output reaches it (temperature 1.5, seed 1:
# "b" first, then "a"): a 400 naming the schema, not a 200 "abort" with half an object (break test 3)
LAZY_HUGE = {
    "type": "object",
    "properties": {"b": {"type": "string", "pattern": "^x{37}$"}, "a": {"type": "string", "pattern": "^a{99999999}$"}},
    "required": ["b"],
}


def test_a_grammar_that_fails_after_some_tokens_is_400(http):
    body = {
        "messages": [{"role": "user", "content": "Output JSON with b then a"}],
        "max_tokens": 80,
        "temperature": 1.5,
        "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": LAZY_HUGE}},
    }
    for _ in range(2):  # the first meets the limit mid-output; the second finds the grammar known to fail
        err = assert_400(http.post("/v1/chat/completions", json=body), "response_format.json_schema.schema")
        assert err["message"].startswith("response_format.json_schema.schema: the grammar cannot be used: "), err
    normal_request_ok(http)
