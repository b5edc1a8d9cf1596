"""Grammar-constrained decoding end to end (issue 5): the real model through the Engine (both grammar
backends) and tool calling through the ``openai`` client against one real server.

Matcher-level checks (keyword groups, edge cases 9/10 on fixed strings, compile counts) live in
test_constrained.py; edge case 11 (malformed ``response_format``) is covered by test_server.py's
``test_bad_requests_are_400``; this file generates.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
from pathlib import Path

import jsonschema
import openai
import pytest

from conftest import close_engine, make_engine, DATA
from server_util import start_server

MODEL = "SmolLM2-135M-Instruct"
# RFC 8259 numbers and integers (edge case 10)
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
JSON_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


@pytest.fixture(scope="module")
def outlines_engine():
    e = make_engine(grammar_backend="outlines")
    yield e
    close_engine(e)


@pytest.fixture(params=["llguidance", "outlines"])
def any_engine(request):
    """The session engine (the default backend, llguidance) or the module's outlines engine."""
    return request.getfixturevalue("engine" if request.param == "llguidance" else "outlines_engine")


def backend_name(e) -> str:
    return e.grammar_cache.backend.name


def finished_by_grammar(out: dict) -> bool:
    """Stopped (EOS where the grammar could end, or grammar termination), not cut by max_new_tokens."""
    return out["meta_info"]["finish_reason"]["type"] == "stop"


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=None)


# ---- the real-world corpus ------------------------------------------------------------------------------------
# Schemas of tests/data/jsonschema/dev/ that the default backend (llguidance) rejects with a ValueError
# (overlapping oneOf, unimplemented keywords such as uniqueItems, a length beside a format...).
# Pinned exactly, so that a change in either direction shows up.
REJECTED_DEFAULT: list[str] = [
    "Github_easy__o90249.json",
    "Github_easy__o9369.json",
    "Github_medium__o12296.json",
    "Github_medium__o26217.json",
    "Github_medium__o73996.json",
    "JsonSchemaStore__drupal-services.json",
    "JsonSchemaStore__lego.json",
    "JsonSchemaStore__pocketmine-plugin.json",
    "JsonSchemaStore__prometheus.rules.json",
    "JsonSchemaStore__sergen.json",
    "MCPspec__ServerRequest.json",
    "Snowplow__sp_247_Normalized.json",
]
# Schemas that compile but whose grammar is looser than the schema (a finished output can fail validation).
# Each is a backend bug to fix (or to reject at compile time); listed so that the test keeps guarding the rest.
KNOWN_UNSOUND: set[str] = set()  # none: the overlapping-oneOf schema (o90249) is refused now
CORPUS_PROMPT = "Generate a JSON object that matches the schema:\n{schema}\nJSON:"
CORPUS_SCHEMA_TOKENS = 48  # the schema text in the prompt is cut to this many tokens
CORPUS_MAX_NEW = 128
CORPUS_GENS = 3
CORPUS_EVERY = 6  # generate for every 6th compiled schema (RADIXRT_CORPUS_EVERY=1: all of them)
MAX_CUT_SHARE = 0.5  # llguidance, the default backend: 20 of 54 cut at 128 tokens


def corpus_files() -> list[Path]:
    return sorted((DATA / "jsonschema" / "dev").glob("*.json"))


def test_dev_corpus_outputs_validate(engine):
    """Every dev schema either compiles, and its 3 temperature-1.0 generations (seeded) that finish validate
    with ``jsonschema``, or compilation fails with a clear ValueError.

    All 120 schemas are compiled; generation runs for every ``RADIXRT_CORPUS_EVERY``-th compiled schema
    (default 6: 18 of the 108 compiled, 54 generations in ONE batched ``generate`` call, ~35 s on 2 busy cores;
    1 = the whole corpus, ~25 min on 2 busy cores).

    Cut-offs: pure temperature-1.0 sampling from SmolLM2-135M random-walks inside strings and numbers that
    the schema leaves unbounded (``"longitude":29932882450484832568...``), so about a quarter of the
    generations never finish: full corpus, 360 generations, 85 cut at max_new_tokens=512 (24%); this
    subset, 16 of 54 at 256 and 20 of 54 at 128, the default (the cut ones are what the wall time pays for:
    every decode step of the batch waits for them; at 128, 34 outputs finish and are validated, 38 at 256). A
    cut output counts as not valid and is reported; the test asserts that no *finished* output is invalid (the
    grammar's soundness, which is what the backend controls) and that cuts stay under half.
    """
    files = corpus_files()
    assert len(files) == 120, "tests/data/jsonschema/dev changed"
    t0 = time.time()
    compiled, rejected = [], []
    for f in files:
        try:
            engine.grammar_check("json_schema", f.read_text())
            compiled.append(f)
        except ValueError as e:
            assert str(e).startswith((f"{backend_name(engine)}: cannot compile json_schema: ", "json_schema:")), e
            rejected.append(f.name)
    t_compile = time.time() - t0
    every = int(os.environ.get("RADIXRT_CORPUS_EVERY", CORPUS_EVERY))
    picked = compiled[::every]
    tok = engine.tokenizer
    prompts, sps, which = [], [], []
    for f in picked:
        text = json.dumps(json.loads(f.read_text()), separators=(",", ":"), ensure_ascii=False)
        cut = tok.decode(tok.encode(text, add_special_tokens=False)[:CORPUS_SCHEMA_TOKENS])
        for k in range(CORPUS_GENS):
            prompts.append(CORPUS_PROMPT.format(schema=cut))
            sps.append(
                {"json_schema": f.read_text(), "temperature": 1.0, "seed": 1234 + k, "max_new_tokens": CORPUS_MAX_NEW}
            )
            which.append(f)
    t1 = time.time()
    outs = engine.generate(prompts, sps)
    t_gen = time.time() - t1
    valid, cut_off, invalid = 0, [], []
    for f, o in zip(which, outs):
        if not finished_by_grammar(o):
            cut_off.append(f.name)
            continue
        schema = json.loads(f.read_text())
        try:
            validator(schema).validate(json.loads(o["text"]))
            valid += 1
        except (ValueError, jsonschema.ValidationError) as e:
            invalid.append((f.name, f"{o['text'][:120]!r}: {str(e).splitlines()[0][:160]}"))
    n_tok = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(
        f"\ndev corpus ({backend_name(engine)}): {len(files)} schemas: compiled {len(compiled)}, "
        f"rejected {len(rejected)} "
        f"({t_compile:.1f}s). Generated {CORPUS_GENS} x {len(picked)} (every {every}th): valid {valid}, "
        f"cut by max_new_tokens={CORPUS_MAX_NEW} {len(cut_off)}, invalid {len(invalid)} "
        f"({n_tok} tokens in {t_gen:.1f}s)"
    )
    for name in rejected:
        print("  rejected:", name)
    for name in sorted(set(cut_off)):
        print(f"  cut: {name} x{cut_off.count(name)}")
    for name, line in invalid:
        print(f"  INVALID{' (known unsound)' if name in KNOWN_UNSOUND else ''}: {name}: {line}")
    assert rejected == REJECTED_DEFAULT
    assert len(compiled) + len(rejected) == len(files)
    assert valid + len(cut_off) + len(invalid) == CORPUS_GENS * len(picked)
    assert not [n for n, _ in invalid if n not in KNOWN_UNSOUND], "a finished constrained output does not validate"
    assert len(cut_off) <= MAX_CUT_SHARE * len(outs), f"{len(cut_off)} of {len(outs)} generations were cut"


# ---- edge cases 8-10 at model level -------------------------------------------------------------------------
def chat_prompt(tok, question: str, examples=(), system: str | None = None) -> str:
    """The chat template over an optional system message, few-shot (question, answer) pairs and the question.

    A bare number is a grammar the model can always extend, so it stops only where it expects its turn to end
    (EOS): few-shot turns with short answers teach it that; plain prompts make it write digits forever.
    """
    msgs = [{"role": "system", "content": system}] if system else []
    for q, a in examples:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": question})
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


INT_SHOTS = [("2+2", "4"), ("3+5", "8"), ("10-3", "7")]
NUM_SHOTS = [("1.5+1", "2.5"), ("half of 3", "1.5"), ("Avogadro's number", "6.022e23")]
NUMBER_ONLY = "Answer with a number only."
ROOT_SCHEMAS = [
    ({"type": "object"}, dict),
    ({"type": "string"}, str),
    ({"type": "integer"}, int),
    ({}, object),
    (True, object),
]


def root_prompt(tok, schema) -> str:
    if schema == {"type": "string"}:
        return chat_prompt(tok, "Name a fruit.")
    if schema == {"type": "integer"}:
        return chat_prompt(tok, "How many legs does a cat have?", INT_SHOTS, NUMBER_ONLY)
    return chat_prompt(tok, "Describe a cat in JSON.")


def test_edge8_root_schemas_generate(any_engine):
    """{"type":"object"}, {"type":"string"}, {"type":"integer"}, {} and true compile and the output parses
    as JSON of that type. outlines-core takes about a minute to index {} and true (documented in
    docs/grammar_keywords.md; test_constrained.py checks them on xgrammar only, too), so they run on xgrammar."""
    e = any_engine
    cases = ROOT_SCHEMAS if backend_name(e) != "outlines" else ROOT_SCHEMAS[:3]
    outs = e.generate(
        [root_prompt(e.tokenizer, s) for s, _ in cases],
        [{"json_schema": s, "temperature": 0, "max_new_tokens": 128} for s, _ in cases],
    )
    for (schema, typ), o in zip(cases, outs):
        assert finished_by_grammar(o), (backend_name(e), schema, o)
        value = json.loads(o["text"])
        assert isinstance(value, typ) and not (typ is int and isinstance(value, bool)), (schema, o["text"])
        if typ is int:
            assert JSON_INTEGER.fullmatch(o["text"]), o["text"]


def test_edge9_escapes_in_bounded_string(any_engine):
    """A required ``s`` with maxLength 40: generations validate (maxLength counts decoded characters) and the
    engine's compiled grammar takes escapes inside the bounded string."""
    e = any_engine
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 40}}, "required": ["s"]}
    prompt = 'Write a JSON object whose "s" is a quote with "double quotes" and a line break:\n'
    outs = e.generate(
        [prompt] * 4, [{"json_schema": schema, "temperature": 1.0, "seed": s, "max_new_tokens": 64} for s in range(4)]
    )
    for o in outs:
        assert finished_by_grammar(o), o
        value = json.loads(o["text"])
        jsonschema.validate(value, schema)
        assert len(value["s"]) <= 40
    m = e.grammar_cache.get("json_schema", json.dumps(schema, separators=(",", ":"))).matcher()
    for t in e.tokenizer.encode(r'{"s":"a\"b\nc"}', add_special_tokens=False):
        assert m.accept_token(t)
    assert m.can_terminate()


def test_edge10_numbers_generate(any_engine):
    """Generated numbers follow RFC 8259 exactly; integers have no fraction or exponent."""
    e = any_engine
    schemas = [
        {"type": "number"},
        {"type": "integer"},
        {"type": "object", "properties": {"x": {"type": "number"}, "n": {"type": "integer"}}, "required": ["x", "n"]},
    ]
    tok = e.tokenizer
    questions = [
        chat_prompt(tok, "pi to two decimals", NUM_SHOTS, NUMBER_ONLY),
        chat_prompt(tok, "How many legs does a cat have?", INT_SHOTS, NUMBER_ONLY),
        chat_prompt(tok, "Give pi as x and the number of legs of a cat as n, in JSON."),
    ]
    prompts, sps = [], []
    for s, q in zip(schemas, questions):
        for seed in range(4):
            prompts.append(q)
            sps.append({"json_schema": s, "temperature": 1.0, "seed": seed, "max_new_tokens": 48})
    outs = e.generate(prompts, sps)
    for sp, o in zip(sps, outs):
        assert finished_by_grammar(o), (backend_name(e), o)
        text = o["text"]
        if sp["json_schema"]["type"] == "number":
            assert JSON_NUMBER.fullmatch(text), text
        elif sp["json_schema"]["type"] == "integer":
            assert JSON_INTEGER.fullmatch(text), text
        else:
            v = json.loads(text)
            jsonschema.validate(v, sp["json_schema"])
            assert isinstance(v["n"], int) and not isinstance(v["n"], bool)
            m = re.fullmatch(r'\{"x":(.*),"n":(.*)\}', text)
            assert m and JSON_NUMBER.fullmatch(m.group(1)) and JSON_INTEGER.fullmatch(m.group(2)), text


# ---- regex, choices, EBNF ---------------------------------------------------------------------------------
REGEXES = [
    r"\d{3}-\d{4}",
    r"(cat|dog)s? and (mouse|bird)",
    r"[A-Z][a-z]{2,8}, [A-Z]{2}",
    r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
]
CHOICES = [["Paris", "London", "Antidisestablishmentarianism"], ["Yes", "Yes, definitely", "No"], ["cat", "category"]]


def test_regex_and_choices(any_engine):
    e = any_engine
    prompts = ["My phone number is ", "I like ", "I live in ", "The date today is "]
    sps = [{"regex": r, "temperature": 1.0, "seed": i, "max_new_tokens": 32} for i, r in enumerate(REGEXES)]
    questions = ["The capital of France is", "Is the sky blue? Answer:", "A word for a group of things:"]
    for q, c in zip(questions, CHOICES):
        prompts.append(q)
        sps.append({"choices": c, "temperature": 0, "max_new_tokens": 16})
        prompts.append(q)
        sps.append({"choices": c, "temperature": 1.0, "seed": 7, "max_new_tokens": 16})
    outs = e.generate(prompts, sps)
    for sp, o in zip(sps, outs):
        assert finished_by_grammar(o), (backend_name(e), sp, o)
        if "regex" in sp:
            assert re.fullmatch(sp["regex"], o["text"]), (backend_name(e), sp["regex"], o["text"])
        else:
            assert o["text"] in sp["choices"], (backend_name(e), sp["choices"], o["text"])


ARITH = r"""
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]{1,6}
"""


def test_ebnf_arithmetic(engine):
    tok = engine.tokenizer
    prompts = [
        chat_prompt(tok, "Write 3 plus 4 as an arithmetic expression."),
        "Expression: (1+2)*3\nExpression: ",
        chat_prompt(tok, "What is 6 times 7? Answer with an arithmetic expression."),
    ]
    outs = engine.generate(prompts, [{"ebnf": ARITH, "temperature": 0, "max_new_tokens": 48}] * 3)
    for o in outs:
        assert finished_by_grammar(o), o
        text = o["text"]
        assert re.fullmatch(r"[0-9+\-*/()]+", text), text
        tree = ast.parse(text, mode="eval")  # parses as an expression of numbers and + - * /
        for node in ast.walk(tree):
            assert isinstance(node, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)), (
                text,
                node,
            )


def test_unsupported_spec_names_the_backend(outlines_engine):
    """A spec the chosen backend cannot take is a clear ValueError naming it, before anything is queued."""
    for kind, spec in (
        ("ebnf", ARITH),
        ("structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "any_text"}})),
    ):
        with pytest.raises(ValueError, match=rf"outlines.*{kind}"):
            outlines_engine.generate("x", {kind: spec, "max_new_tokens": 4})
    assert outlines_engine.get_server_info()["num_waiting"] == 0


def test_grammar_backend_none_rejects_grammars():
    e = make_engine(grammar_backend="none", max_total_tokens=512)
    try:
        for sp in ({"json_schema": {"type": "object"}}, {"regex": "a+"}, {"choices": ["a", "b"]}):
            with pytest.raises(ValueError, match="grammar_backend='none'"):
                e.generate("x", {**sp, "max_new_tokens": 4})
        assert e.generate("x", {"max_new_tokens": 2, "temperature": 0})["meta_info"]["completion_tokens"] == 2
    finally:
        close_engine(e)


def test_bad_specs_rejected_before_queueing(engine):
    for sp, needle in (
        ({"json_schema": '{"type": "object"'}, "json_schema"),
        ({"regex": "("}, "regex"),
        ({"json_schema": {"properties": {"x": {"pattern": "("}}}}, "pattern"),
        ({"ebnf": 'root ::= "a" undefined_rule'}, "ebnf"),
    ):
        with pytest.raises(ValueError, match=needle):
            engine.generate("x", {**sp, "max_new_tokens": 4})


def test_grammars_that_accept_nothing(engine):
    """An empty regex or a rule that only recurses is refused at compile time naming the field; a grammar that
    dead-ends only once it runs, before its first token (llguidance's lexer limit on ``a{1000000}``), is
    refused by the scheduler naming the field too (a 400 on the server), never a proper ``stop`` after an EOS
    the dead end allowed, nor an empty answer."""
    for sp, field in (
        ({"regex": "[^\\s\\S]"}, "regex"),
        ({"ebnf": "root ::= root"}, "ebnf"),
        ({"ebnf": "root ::= a\na ::= root"}, "ebnf"),
    ):
        with pytest.raises(ValueError, match=f"{field}: the grammar accepts no string"):
            engine.generate("x", {**sp, "max_new_tokens": 4})
    with pytest.raises(ValueError, match="regex: the grammar cannot be used: ") as e:
        engine.generate("Hi", {"regex": "a{1000000}", "max_new_tokens": 8, "temperature": 0})
    assert e.value.param == "regex"


# ---- termination ---------------------------------------------------------------------------------------------
def test_termination_and_no_whitespace_loops(any_engine):
    """A grammar that is complete ends the request (finish_reason stop) even with a huge max_new_tokens, and
    JSON output is compact, so it never loops on whitespace, even after a prompt full of indentation."""
    e = any_engine
    fixed = {"type": "object", "properties": {"a": {"const": 1}, "b": {"enum": ["x"]}}, "required": ["a", "b"]}
    free = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        },
        "required": ["name", "tags"],
    }
    indented = 'Here is the pretty-printed JSON:\n{\n    "name": "x",\n    \n    \n        '
    outs = e.generate(
        [indented, indented, indented, "Pick: "],
        [
            {"json_schema": fixed, "temperature": 0, "max_new_tokens": 2000},
            {"json_schema": free, "temperature": 0, "max_new_tokens": 2000},
            {"json_schema": free, "temperature": 1.0, "seed": 5, "max_new_tokens": 2000},
            {"regex": "(ab|cd)", "temperature": 0, "max_new_tokens": 2000},
        ],
    )
    assert outs[0]["text"] == '{"a":1,"b":"x"}'
    assert outs[3]["text"] in ("ab", "cd")
    for o in outs:
        assert finished_by_grammar(o), o
        assert o["meta_info"]["completion_tokens"] < 64, o
    for o in outs[1:3]:
        v = json.loads(o["text"])
        jsonschema.validate(v, free)
        assert o["text"] == json.dumps(v, separators=(",", ":"), ensure_ascii=False), o["text"]


# ---- tools through the openai client --------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 30}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# One earlier turn with a call makes the small model open a call itself under tool_choice "auto".
FEW_SHOT = [
    {"role": "user", "content": "What is the weather in London?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "London", "unit": "celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 14}'},
    {"role": "assistant", "content": "It is 14°C in London."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def tool_server():
    s = start_server("--context-length", "2048")
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def oai(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def chat(oai, messages, tool_choice, stream=False, **kw):
    kw = {"temperature": 0, "max_tokens": 80, **kw}
    return oai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice=tool_choice, stream=stream, **kw
    )


def collect_stream(stream) -> dict:
    """Concatenate a streamed chat completion (one choice): content, calls by index, finish_reason."""
    content, calls, finish, n_arg_chunks = "", {}, None, 0
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        if c.delta.content:
            content += c.delta.content
        for tc in c.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls, "a call's header was sent twice"
                assert tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.index in calls, "arguments before the call's header"
                calls[tc.index]["arguments"] += tc.function.arguments
                n_arg_chunks += 1
        if c.finish_reason is not None:
            finish = c.finish_reason
    return {
        "content": content or None,
        "calls": [calls[i] for i in sorted(calls)],
        "finish": finish,
        "arg_chunks": n_arg_chunks,
    }


def check_calls(calls, allowed=None) -> list[dict]:
    out = []
    for c in calls:
        fn = c.function if hasattr(c, "function") else None
        name, args = (fn.name, fn.arguments) if fn else (c["name"], c["arguments"])
        if hasattr(c, "id"):
            assert c.id.startswith("call_") and c.type == "function"
        assert name in (allowed or SCHEMAS), name
        value = json.loads(args)
        jsonschema.validate(value, SCHEMAS[name])
        out.append({"name": name, "arguments": args})
    return out


@pytest.mark.parametrize("mode", ["required", "named", "auto"])
def test_tool_calls_streamed_and_not(oai, mode):
    """required / named / auto: the parsed calls validate against the tool's schema, and the streamed
    argument deltas concatenate exactly to the non-streamed arguments (greedy)."""
    choice = {"required": "required", "named": NAMED, "auto": "auto"}[mode]
    messages = FEW_SHOT if mode == "auto" else ASK
    r = chat(oai, messages, choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.tool_calls, c
    assert c.message.content is None
    calls = check_calls(c.message.tool_calls, ["get_time"] if mode == "named" else None)
    if mode == "named":
        assert len(calls) == 1
    # one token per step (speculation off for this request: its drafts come in the chunks the cost model's
    # timing picks), so the arguments' pieces are known to be several
    s = collect_stream(chat(oai, messages, choice, stream=True, extra_body={"speculative": False}))
    assert s["finish"] == "tool_calls" and s["content"] is None
    assert [{"name": x["name"], "arguments": x["arguments"]} for x in s["calls"]] == calls
    assert s["arg_chunks"] >= 2, "arguments should stream in pieces"
    assert all(x["id"].startswith("call_") for x in s["calls"])


def test_tool_auto_may_answer_in_text(oai):
    """With tool_choice auto (the default when tools are given) the model may answer in text: no tool_calls,
    finish_reason stop, streamed content equal to the non-streamed content."""
    r = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=40)
    c = r.choices[0]
    assert c.message.tool_calls is None and c.message.content and c.finish_reason in ("stop", "length")
    s = collect_stream(
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=40, stream=True)
    )
    assert s["content"] == c.message.content and not s["calls"] and s["finish"] == c.finish_reason


def test_tool_required_single_call_and_history(oai):
    """parallel_tool_calls=false gives exactly one call; a follow-up turn carrying the call and the tool's
    result renders and answers."""
    r = chat(oai, ASK, "required", parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    check_calls(c.message.tool_calls)
    call = c.message.tool_calls[0]
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"result": "sunny, 22 C"}'},
    ]
    r2 = oai.chat.completions.create(
        model=MODEL, messages=follow, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=16
    )
    assert r2.choices[0].message.content and r2.choices[0].message.tool_calls is None


CHAT = {"model": MODEL, "messages": ASK, "max_tokens": 4}
BAD_TOOLS = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "bad name!"}}]}, "tools[1].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]},
        "tools[0].function.parameters",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}},
                    },
                }
            ]
        },
        "tools[0].function.parameters",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required", "regex": "a+"}, "regex"),
]


def test_bad_tools_are_400(tool_server):
    with tool_server.client() as http:
        for body, param in BAD_TOOLS:
            r = http.post("/v1/chat/completions", json={**CHAT, **body})
            assert r.status_code == 400, (body, r.status_code, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
            assert err["message"]
        assert http.get("/health").status_code == 200
        r = http.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS, "tool_choice": "none", "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"].get("tool_calls") is None
    tool_server.wait_idle()
