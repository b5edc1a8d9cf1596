"""Each example end to end against a real ``radixrt serve`` (over ZMQ), with its --small bound."""

from __future__ import annotations

import importlib.util
import json
import sys

import jsonschema
import pytest

import dsl_util
from dsl_util import ROOT, page_floor


def _load(name: str):
    path = ROOT / "examples" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def zmq_backend(request):
    srv = dsl_util.start_server(request.config)
    try:
        srv.wait_ready()
        yield dsl_util.endpoint("zmq")
    finally:
        dsl_util.stop_server()


def test_tool_agent(zmq_backend, capsys):
    ex = _load("tool_agent")
    r = ex.main(["--small"], backend=zmq_backend)
    out = capsys.readouterr().out
    assert r["questions"] == 4 and r["failed_programs"] == 0
    assert r["parsed"] == r["calls"] > 0 and r["parsed_share"] == 1.0  # every call parsed, none cut off
    assert r["answered"] == 4  # the last step may only answer, so every question ends with an answer
    assert 4 < r["calls"] <= 8 and r["tool_calls"] == r["calls"] - 4
    assert r["cached_share"] > 0.8  # the shared system prompt + few-shot turns come from the cache
    assert "calls that parsed: " in out and "(100.0 %)" in out and "cached-token share" in out
    assert "throughput:" in out and out.count("Q: ") == 4


def test_tool_agent_tools():
    ex = _load("tool_agent")
    assert ex.calculator("2*(3+4)") == 14 and ex.calculator("-2**3") == -8
    for bad in ("__import__('os')", "a+1", "2**1000", "1/0", "(("):
        with pytest.raises(ValueError):
            ex.calculator(bad)
    assert ex.convert(100, "c", "f") == pytest.approx(212) and ex.convert(1, "mi", "km") == pytest.approx(1.609344)
    with pytest.raises(ValueError, match="cannot convert kg to m"):
        ex.convert(1, "kg", "m")
    assert ex.run_tool({"tool": "lookup", "key": "france_capital"}) == "The capital of France is Paris."
    assert ex.run_tool({"tool": "calculator", "expression": "1/0"}).startswith("error:")
    longest = [
        {"tool": "calculator", "expression": "1" * ex.EXPR_MAX},
        {"tool": "convert", "value": "-1234567.123", "from_unit": "day", "to_unit": "min"},
        {"tool": "lookup", "key": max(ex.KNOWLEDGE, key=len)},
        {"tool": "final_answer", "answer": "x" * 48},
    ]
    for call in longest:  # the longest calls the schema admits still fit the token bound (1 token >= 1 char)
        jsonschema.validate(call, ex.CALL_SCHEMA)
        assert len(json.dumps(call, separators=(",", ":"))) < ex.CALL_MAX_TOKENS
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool": "final_answer", "answer": "x" * 49}, ex.CALL_SCHEMA)


def test_json_extraction(zmq_backend):
    ex = _load("json_extraction")
    r = ex.main(["--small"], backend=zmq_backend)
    assert r["texts"] == 3 and r["valid"] == 3
    for rec in r["records"]:
        ex.Person.model_validate_json(rec)
    assert json.loads(r["records"][0])["age"] == 34 and json.loads(r["records"][0])["name"] == "Maria Lopez"


def test_tree_of_thought(zmq_backend):
    ex = _load("tree_of_thought")
    r = ex.main(["--small"], backend=zmq_backend)
    assert r["errors"] == 0 and r["leaves"] == [4]
    st = r["states"][0]
    assert len(st["approach"]) == 2 and len(st["verdict"]) == 2 and all(len(v) == 2 for v in st["verdict"])
    assert st.text().endswith("<|im_end|>\n") and st.ret_value["best"] in st.ret_value["leaves"]


def test_few_shot_select(zmq_backend):
    ex = _load("few_shot_select")
    r = ex.main(["--small"], backend=zmq_backend)
    assert r["inputs"] == 6 and r["errors"] == 0 and set(r["labels"]) <= set(ex.LABELS)
    assert r["cached_share"] > 0.85  # the few-shot prefix was prefilled once, before the batch


def test_multi_turn_chat(zmq_backend):
    ex = _load("multi_turn_chat")
    r = ex.main(["--small"], backend=zmq_backend)
    assert r["error"] is None and len(r["turns"]) == 3
    for prev, cur in zip(r["turns"], r["turns"][1:]):  # each turn reuses every earlier one
        assert cur["cached_tokens"] >= page_floor(prev["prompt_tokens"] - 1) > 0
    assert [m["role"] for m in r["messages"]] == ["system"] + ["user", "assistant"] * 3
