"""docs/compatibility.md against the code and a live server: every row's example is sent and answers as its
status says (supported/ignored: 200; refused: 400 naming the field, in Anthropic's shape on /v1/messages), the tables
list every field of OpenAI's request types (the ``openai`` package: chat, completions, responses), of Anthropic's (the
``anthropic`` package: messages), of SGLang's ``SamplingParams``/``GenerateReqInput`` (the ``sglang`` package) and of
our own request models; plus the effects of the new keys and 400s for
their bad values, with the server still serving afterwards."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from radixrt.runtime.sampling.params import KNOWN_KEYS
from radixrt.runtime.server.native.body import GENERATE_KEYS, IGNORED_KEYS, REFUSED_KEYS
from radixrt.runtime.server.anthropic import protocol as msg_protocol
from radixrt.runtime.server.openai.protocol import (
    GENERATE_NAMES,
    IGNORED_FIELDS,
    REFUSED_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from radixrt.runtime.server.openai.responses import protocol as resp_protocol

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (supported|ignored|refused) \| `(.*)` \| (.*) \|$")
BASE = {
    "chat": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0},
    "comp": {"prompt": "Hi", "max_tokens": 1, "temperature": 0},
    "gen": {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
    "resp": {"input": "Hi", "max_output_tokens": 1, "temperature": 0, "store": False},
    "msg": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0},
}
SECTIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "comp",
    "/generate": "gen",
    "/generate sampling_params": "sp",
    "/v1/responses": "resp",
    "/v1/messages": "msg",
}
ROUTE = {
    "chat": "/v1/chat/completions",
    "comp": "/v1/completions",
    "gen": "/generate",
    "sp": "/generate",
    "resp": "/v1/responses",
    "msg": "/v1/messages",
}
PROTOCOLS = {"resp": resp_protocol, "msg": msg_protocol}
FRANCE = "The capital of France is"


def tables() -> dict[str, dict[str, tuple[str, dict]]]:
    """{section: {field: (status, example)}} from docs/compatibility.md."""
    out: dict[str, dict] = {}
    sec = None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            sec = SECTIONS[line[3:].strip()]
            out[sec] = {}
        m = ROW.match(line)
        if m:
            assert sec is not None and m[1] not in out[sec], line
            out[sec][m[1]] = (m[2], json.loads(m[3]))
    return out


def fields(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def pinned(dist: str) -> bool:
    """Whether the installed ``dist`` is the release constraints.txt pins (``make test`` installs that one)."""
    import importlib.metadata

    pins = dict(
        line.split("==", 1)
        for line in (DOC.parents[1] / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    return importlib.metadata.version(dist) == pins[dist]


def check_table(rows: set[str], ours: set[str], sdk: set[str], dist: str) -> None:
    """Every field our request model takes has a row (always). The rows are exactly ours plus the SDK's
    fields only on the pinned SDK release: a newer release with new fields is a table to update when the pin
    moves, not a failure, since a client sending a field we do not list gets a clear answer either way."""
    assert ours <= rows, f"fields our code takes but docs/compatibility.md lacks: {sorted(ours - rows)}"
    if pinned(dist):
        assert rows == ours | sdk, f"{dist}: missing {sorted(ours | sdk - rows)}, stale {sorted(rows - ours - sdk)}"


def test_tables_list_every_field_of_the_three_apis():
    from openai.types import completion_create_params as comp_params
    from openai.types.chat import completion_create_params as chat_params
    from sglang.srt.sampling.sampling_params import SamplingParams as SglSamplingParams

    t = tables()
    chat_api = set(chat_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    comp_api = set(comp_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    check_table(set(t["chat"]), fields(ChatCompletionRequest) | set(GENERATE_NAMES), chat_api, "openai")
    check_table(set(t["comp"]), fields(CompletionRequest) | set(GENERATE_NAMES), comp_api, "openai")
    sglang_sampling = set(inspect.signature(SglSamplingParams.__init__).parameters) - {"self"}
    check_table(set(t["sp"]), KNOWN_KEYS | {"sampling_seed"}, sglang_sampling, "sglang")
    check_table(set(t["gen"]), set(GENERATE_KEYS), sglang_generate_fields(), "sglang")


def test_tables_list_every_field_of_responses_and_messages():
    import typing

    from anthropic.types import message_create_params as msg_params
    from openai.types.responses import response_create_params as resp_params

    t = tables()
    resp_api = set(resp_params.ResponseCreateParamsBase.__annotations__) | {"stream"}
    check_table(set(t["resp"]), fields(resp_protocol.ResponsesRequest), resp_api, "openai")
    msg_api = set(typing.get_type_hints(msg_params.MessageCreateParamsNonStreaming))
    check_table(set(t["msg"]), fields(msg_protocol.MessagesRequest), msg_api, "anthropic")


def sglang_generate_fields() -> set[str]:
    """The fields of SGLang's ``GenerateReqInput``, read from its source (importing its module needs the
    whole SGLang server stack)."""
    import ast
    import importlib.util

    path = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt" / "managers" / "io_struct.py"
    cls = next(
        n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput"
    )
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_statuses_match_the_code():
    """ignored <=> the code's list of ignored fields; refused rows are in the code's refusal lists or
    refused by a check (the live test below proves the 400 either way)."""
    t = tables()
    for sec in ("chat", "comp"):
        for f, (status, _) in t[sec].items():
            assert (status == "ignored") == (f in IGNORED_FIELDS), (sec, f)
            if f in REFUSED_FIELDS:
                assert status == "refused", (sec, f)
    for f, (status, _) in t["gen"].items():
        assert (status == "ignored") == (f in IGNORED_KEYS), f
        assert (status == "refused") == (f in REFUSED_KEYS), f
        assert (status == "supported") == (f in GENERATE_KEYS), f
    for f, (status, _) in t["sp"].items():
        assert (status == "ignored") == (f == "custom_params"), f
        assert status != "refused", f
    for sec, proto in PROTOCOLS.items():
        for f, (status, _) in t[sec].items():
            assert (status == "ignored") == (f in proto.IGNORED_FIELDS), (sec, f)
            assert (status == "refused") == (f in proto.REFUSED_FIELDS), (sec, f)


def _request(sec: str, example: dict) -> dict:
    if sec == "sp":
        body = json.loads(json.dumps(BASE["gen"]))
        body["sampling_params"].update(example)
        return body
    body = {**BASE[sec], **example}
    if "input_ids" in example:
        body.pop("text")
    if sec == "gen" and "sampling_params" in example:
        body["sampling_params"] = {**BASE["gen"]["sampling_params"], **example["sampling_params"]}
    return body


@pytest.fixture(scope="module")
def http(api_server):
    with api_server.client() as c:
        yield c


@pytest.fixture(autouse=True)
def _idle(request):
    yield
    if "http" in request.fixturenames:  # the table checks need no server
        request.getfixturevalue("api_server").wait_idle()


@pytest.mark.parametrize("sec", ["chat", "comp", "gen", "sp", "resp", "msg"])
def test_every_row_answers_as_documented(http, sec):
    # the session rows continue this session; closing it unpins its pages (the pool check after the test)
    assert (
        http.post("/open_session", json={"capacity_of_str_len": 4096, "session_id": "compat-session"}).json()
        == "compat-session"
    )
    stored = None
    if sec == "resp":  # previous_response_id's row continues a stored response (deleted after: it pins a session)
        stored = http.post("/v1/responses", json={**BASE["resp"], "store": True}).json()["id"]
    try:
        for field, (status, example) in tables()[sec].items():
            if stored is not None:
                example = json.loads(json.dumps(example).replace("$STORED", stored))
            r = http.post(ROUTE[sec], json=_request(sec, example))
            if status == "refused":
                assert r.status_code == 400, (sec, field, r.status_code, r.text)
                err = r.json()["error"]
                if sec == "msg":  # Anthropic's shape: no param, the message names the field
                    assert err["type"] == "invalid_request_error" and err["message"].startswith(field), (field, err)
                else:
                    assert err["param"] == field and err["type"] == "invalid_request_error", (sec, field, err)
            else:
                assert r.status_code == 200, (sec, field, r.status_code, r.text)
    finally:
        if stored is not None:
            assert http.delete(f"/v1/responses/{stored}").json()["deleted"] is True
        assert http.post("/close_session", json={"session_id": "compat-session"}).json() == {"success": True}


def gen(http, **body) -> dict:
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


# ---- effects of the new keys --------------------------------------------------------------------------
def test_native_n_shares_the_prompt_kv(http, api_server):
    http.post("/flush_cache")
    prompt = "Write a long story about a dragon who lives in a castle near the sea, with many details. " * 2
    outs = gen(http, text=prompt, sampling_params={"n": 3, "max_new_tokens": 4, "temperature": 0})
    assert isinstance(outs, list) and len(outs) == 3
    assert len({o["text"] for o in outs}) == 1  # greedy: the same sample three times
    metas = sorted((o["meta_info"] for o in outs), key=lambda m: m["cached_tokens"])
    n_prompt = metas[0]["prompt_tokens"]
    assert metas[0]["cached_tokens"] == 0
    # the other two hit the first one's prompt pages (whole pages of 16 tokens)
    assert [m["cached_tokens"] for m in metas[1:]] == [n_prompt // 16 * 16] * 2
    seeded = gen(http, text=FRANCE, sampling_params={"n": 2, "max_new_tokens": 6, "temperature": 1.0, "seed": 5})
    again = gen(http, text=FRANCE, sampling_params={"n": 2, "max_new_tokens": 6, "temperature": 1.0, "seed": 5})
    assert [o["text"] for o in seeded] == [o["text"] for o in again]


def test_logit_bias_native_and_openai(http, tokenizer):
    paris = tokenizer.encode(" Paris", add_special_tokens=False)[0]
    rome = tokenizer.encode(" Rome", add_special_tokens=False)[0]
    base = gen(http, text=FRANCE, sampling_params={"max_new_tokens": 1, "temperature": 0})
    assert base["output_ids"] == [paris]
    out = gen(
        http,
        text=FRANCE,
        sampling_params={"max_new_tokens": 1, "temperature": 0, "logit_bias": {str(paris): -100, str(rome): 100}},
    )
    assert out["output_ids"] == [rome] and out["text"] == " Rome"
    r = http.post(
        "/v1/completions", json={"prompt": FRANCE, "max_tokens": 1, "temperature": 0, "logit_bias": {str(rome): 100}}
    ).json()
    assert r["choices"][0]["text"] == " Rome"


def test_spaces_between_special_tokens(http, tokenizer):
    # two special tokens forced by their bias, shown with skip_special_tokens false
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    sp = {
        "max_new_tokens": 3,
        "temperature": 0,
        "skip_special_tokens": False,
        "ignore_eos": True,
        "logit_bias": {str(start): 100},
    }
    spaced = gen(http, text=FRANCE, sampling_params=sp)
    tight = gen(http, text=FRANCE, sampling_params={**sp, "spaces_between_special_tokens": False})
    assert spaced["output_ids"] == tight["output_ids"] == [start] * 3 and end != start
    assert tight["text"] == "<|im_start|>" * 3
    assert spaced["text"] == "<|im_start|> <|im_start|> <|im_start|>"
    skipped = gen(http, text=FRANCE, sampling_params={**sp, "skip_special_tokens": True})
    assert skipped["text"] == ""


def test_stream_interval(http):
    # speculation off for this request: with it a step may emit several tokens (as many as its drafts kept,
    # which the shared server's cost model chooses from measured step times), and a chunk then spans them
    body = {
        "text": FRANCE,
        "stream": True,
        "sampling_params": {
            "max_new_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
            "stream_interval": 3,
            "speculative": False,
        },
    }
    with http.stream("POST", "/generate", json=body) as r:
        events = [json.loads(x[5:]) for x in r.iter_lines() if x.startswith("data:") and x != "data: [DONE]"]
    assert [len(e["output_ids"]) for e in events] == [3, 6, 8]


def test_vllm_guided_and_structured_outputs(http):
    chat = {
        "messages": [{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    for extra in (
        {"guided_choice": ["yes", "no"]},
        {"structured_outputs": {"choice": ["yes", "no"]}},
        {"guided_regex": "(yes|no)"},
        {"structured_outputs": {"regex": "(yes|no)"}},
        {"guided_grammar": 'root ::= "yes" | "no"'},
    ):
        r = http.post("/v1/chat/completions", json={**chat, **extra})
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["choices"][0]["message"]["content"] in ("yes", "no"), extra
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for extra in (
        {"guided_json": schema},
        {"structured_outputs": {"json": schema}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}},
    ):
        r = http.post(
            "/v1/completions", json={"prompt": "A JSON object: ", "max_tokens": 12, "temperature": 0, **extra}
        )
        assert r.status_code == 200, (extra, r.text)
        assert isinstance(json.loads(r.json()["choices"][0]["text"])["a"], int), extra


def test_include_stop_str_and_min_tokens(http):
    comp = {"prompt": FRANCE, "max_tokens": 8, "temperature": 0, "stop": ["."]}
    assert http.post("/v1/completions", json=comp).json()["choices"][0]["text"] == " Paris"
    kept = http.post("/v1/completions", json={**comp, "include_stop_str_in_output": True}).json()
    assert kept["choices"][0]["text"] == " Paris."


BAD = [
    ("/generate", {"text": FRANCE, "sampling_params": {"n": -1}}, "n"),
    ("/generate", {"text": FRANCE, "sampling_params": {"n": 2}, "stream": True}, "n"),
    ("/generate", {"text": FRANCE, "sampling_params": {"logit_bias": {"5": "x"}}}, "logit_bias"),
    ("/generate", {"text": FRANCE, "sampling_params": {"logit_bias": {"abc": 1}}}, "logit_bias"),
    ("/generate", {"text": FRANCE, "sampling_params": {"logit_bias": {"99999999": 1}}}, "logit_bias"),
    ("/generate", {"text": FRANCE, "sampling_params": {"stream_interval": 0}}, "stream_interval"),
    ("/generate", {"text": FRANCE, "sampling_params": {"custom_params": 3}}, "custom_params"),
    ("/generate", {"text": FRANCE, "sampling_params": {"seed": 1, "sampling_seed": 2}}, "sampling_seed"),
    ("/generate", {"text": FRANCE, "sampling_params": {"max_new_token": 2}}, "sampling_params"),
    # sampling parameters beside sampling_params: refused even when falsy (they were ignored as unset keys)
    ("/generate", {"text": FRANCE, "speculative": False}, "speculative"),
    ("/generate", {"text": FRANCE, "temperature": 0}, "temperature"),
    ("/generate", {"text": FRANCE, "sampling_params": {}, "max_new_tokens": 0}, "max_new_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": -1}, "n"),
    ("/v1/completions", {"prompt": FRANCE, "logit_bias": {"5": "abc"}}, "logit_bias.5"),
    ("/v1/completions", {"prompt": FRANCE, "logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": FRANCE, "structured_outputs": {"xml": "<a/>"}}, "structured_outputs.xml"),
    ("/v1/completions", {"prompt": FRANCE, "structured_outputs": {}}, "structured_outputs"),
    ("/v1/completions", {"prompt": FRANCE, "guided_regex": "("}, "guided_regex"),
    ("/v1/completions", {"prompt": FRANCE, "guided_json": {"type": 12}}, "guided_json"),
    ("/v1/completions", {"prompt": FRANCE, "guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
]


def test_bad_values_are_400_naming_the_field(http):
    for route, body, param in BAD:
        r = http.post(route, json=body)
        assert r.status_code == 400, (body, r.status_code, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["message"], (body, err)
    assert gen(http, text=FRANCE, sampling_params={"max_new_tokens": 2, "temperature": 0})["text"] == " Paris."


def test_responses_and_messages_opt_out_of_speculation(http):
    """``speculative`` on /v1/responses and /v1/messages is chat's field: false reaches the request (no draft
    verified for it), a value that is not a boolean is a 400 naming it."""
    for proto, route, base in (
        (resp_protocol, "/v1/responses", BASE["resp"]),
        (msg_protocol, "/v1/messages", BASE["msg"]),
    ):
        model = proto.ResponsesRequest if proto is resp_protocol else proto.MessagesRequest
        assert proto.chat_body(model(**base, model="m", speculative=False))["speculative"] is False
        assert proto.chat_body(model(**base, model="m"))["speculative"] is True
        before = http.get("/get_server_info").json()["cache"]["speculative"]["verify_steps"]
        r = http.post(
            route,
            json={**base, "max_output_tokens" if proto is resp_protocol else "max_tokens": 16, "speculative": False},
        )
        assert r.status_code == 200, r.text
        assert http.get("/get_server_info").json()["cache"]["speculative"]["verify_steps"] == before
        for bad in ("yes", None, 1, [False]):
            r = http.post(route, json={**base, "speculative": bad})
            assert r.status_code == 400, (route, bad, r.text)
            err = r.json()["error"]
            assert err.get("param") == "speculative" or err["message"].startswith("speculative"), (route, bad, err)
