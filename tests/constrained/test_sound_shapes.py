"""The combinations xgrammar and outlines-core dropped silently (issue 29), each a named test that fails
without ``schema_sound``: the shape is either enforced (allOf merged) or refused with the keyword named.

Found on the dev corpus: a ``pattern`` beside ``maxLength`` (4 schemas), a ``pattern`` beside a ``format``,
the parent's keywords beside ``allOf`` (3 schemas), overlapping ``oneOf`` branches, ``uniqueItems``.
llguidance enforces or refuses all of them itself; it is checked the same way.
"""

from __future__ import annotations

import json

import pytest

from radixrt.runtime.constrained import allocate_token_bitmask, create_backend

EOS = 2
BACKENDS = ["xgrammar", "outlines", "llguidance"]


@pytest.fixture(scope="module")
def env():
    from radixrt.runtime.models.loader import load_config, load_tokenizer

    tok = load_tokenizer()
    vocab = load_config().vocab_size
    return {"tok": tok, "vocab": vocab, **{b: create_backend(b, tok, vocab) for b in BACKENDS}}


def accepts(env, compiled, text: str) -> bool:
    """Every token of ``text`` allowed by the mask in turn, then EOS allowed."""
    m = compiled.matcher()
    bm = allocate_token_bitmask(1, env["vocab"])
    for t in env["tok"].encode(text, add_special_tokens=False) + [EOS]:
        m.fill_next_token_bitmask(bm, 0)
        if not (int(bm[0, t // 32]) >> (t % 32)) & 1:
            return False
        assert m.accept_token(t)
    return True


def _obj(prop: dict) -> str:
    return json.dumps({"type": "object", "properties": {"s": prop}, "required": ["s"], "additionalProperties": False})


def _refused_or_enforced(env, backend, schema: str, bad: list[str], good: list[str], keyword: str):
    try:
        compiled = env[backend].compile("json_schema", schema)
    except ValueError as e:
        assert f"'{keyword}'" in str(e) or keyword in str(e), (backend, str(e))
        assert str(e).startswith(f"{backend}: cannot compile json_schema: ")
        return "refused"
    for text in bad:
        assert not accepts(env, compiled, text), (backend, text)
    for text in good:
        assert accepts(env, compiled, text), (backend, text)
    return "enforced"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pattern_beside_max_length(env, backend):
    """``^[a-z]+$`` with ``maxLength: 3`` generated ``"rownames"`` on xgrammar."""
    how = _refused_or_enforced(
        env,
        backend,
        _obj({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}),
        ['{"s":"rownames"}', '{"s":"abcd"}'],
        ['{"s":"abc"}'],
        "maxLength",
    )
    assert how == ("enforced" if backend == "llguidance" else "refused")


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_pattern_that_implies_the_length_is_kept(env, backend):
    compiled = env[backend].compile("json_schema", _obj({"type": "string", "pattern": "^[a-z]{2,3}$", "maxLength": 3}))
    assert accepts(env, compiled, '{"s":"abc"}') and not accepts(env, compiled, '{"s":"abcd"}')


@pytest.mark.parametrize("backend", BACKENDS)
def test_pattern_beside_format(env, backend):
    """``"format": "date", "pattern": "^2"``: xgrammar dropped the pattern (a 1999 date passed)."""
    how = _refused_or_enforced(
        env,
        backend,
        _obj({"type": "string", "format": "date", "pattern": "^2"}),
        ['{"s":"1999-01-01"}'],
        ['{"s":"2020-01-01"}'],
        "format",
    )
    assert how == ("enforced" if backend == "llguidance" else "refused")


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_of_keeps_the_parent(env, backend):
    """``{"type": "string", "allOf": [...]}`` gave an object on xgrammar: the parent's keywords were lost."""
    schema = _obj({"type": "string", "allOf": [{"maxLength": 3}, {"minLength": 2}]})
    how = _refused_or_enforced(
        env,
        backend,
        schema,
        ['{"s":{}}', '{"s":"abcd"}', '{"s":"a"}', '{"s":1}'],
        ['{"s":"ab"}', '{"s":"abc"}'],
        "allOf",
    )
    assert how == "enforced"
    refs = json.dumps(
        {
            "type": "object",
            "$defs": {"a": {"properties": {"x": {"type": "integer"}}, "required": ["x"]}},
            "allOf": [{"$ref": "#/$defs/a"}, {"properties": {"y": {"type": "boolean"}}, "required": ["y"]}],
        }
    )
    _refused_or_enforced(
        env, backend, refs, ['{"x":1}', '{"y":true}', '{"x":"1","y":true}'], ['{"x":1,"y":true}'], "allOf"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_one_of_is_refused(env, backend):
    """Both libraries treat ``oneOf`` as ``anyOf``: ``3`` matches both branches and is invalid."""
    how = _refused_or_enforced(
        env, backend, json.dumps({"oneOf": [{"type": "integer"}, {"minimum": 2}]}), ["3"], ["1"], "oneOf"
    )
    assert how == "refused"
    disjoint = env[backend].compile("json_schema", json.dumps({"oneOf": [{"type": "integer"}, {"type": "string"}]}))
    assert accepts(env, disjoint, "3") and accepts(env, disjoint, '"a"') and not accepts(env, disjoint, "null")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "prop,keyword",
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "integer", "not": {"const": 3}}, "not"),
    ],
)
def test_unsupported_keywords_are_named(env, backend, prop, keyword):
    with pytest.raises(ValueError, match=f"^{backend}: cannot compile json_schema: .*{keyword}"):
        env[backend].compile("json_schema", _obj(prop))


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_of_keeps_the_parent(env, backend):
    """JSONSchemaBench's Snowplow sp_201 (Slack message): ``additionalProperties: false`` beside
    ``anyOf: [{required: [text]}, {required: [channel]}]``. xgrammar lowered the branches alone (extra keys got
    through), outlines-core the parent alone (``{}`` got through)."""
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"text": {"type": "string"}, "channel": {"type": "string"}},
            "additionalProperties": False,
            "anyOf": [{"required": ["text"]}, {"required": ["channel"]}],
        }
    )
    how = _refused_or_enforced(
        env,
        backend,
        schema,
        ["{}", '{"text":"a","x":1}', '{"x":1,"channel":"c"}'],
        ['{"text":"a"}', '{"channel":"c"}', '{"text":"a","channel":"c"}'],
        "anyOf",
    )
    assert how == "enforced"
    one = json.dumps(
        {
            "type": "object",
            "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer"}},
            "required": ["k"],
            "additionalProperties": False,
            "oneOf": [{"properties": {"k": {"const": "a"}}}, {"properties": {"k": {"const": "b"}}}],
        }
    )
    how = _refused_or_enforced(
        env, backend, one, ['{"k":"a","z":1}', '{"k":"c"}', "{}"], ['{"k":"a"}', '{"k":"b","v":2}'], "oneOf"
    )
    # distributed, the branches are disjoint by the required k's const; llguidance does not look that far and
    # refuses the oneOf by name ("oneOf constraints are not supported")
    assert how == ("refused" if backend == "llguidance" else "enforced")


@pytest.mark.parametrize("backend", BACKENDS)
def test_keywords_of_another_type_are_dropped(env, backend):
    """JSONSchemaBench's Github_medium o45225: ``type: array`` with ``properties: {}`` and
    ``additionalProperties: false``, which outlines-core took for an object (it generated ``{}``)."""
    schema = json.dumps(
        {"type": "array", "items": {"type": "integer"}, "properties": {}, "additionalProperties": False}
    )
    how = _refused_or_enforced(env, backend, schema, ["{}", '["a"]'], ["[]", "[1,2]"], "properties")
    assert how == "enforced"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fmt,bad", [("time", r'{"s":"01:08:31\*57"}'), ("uri", '{"s":"urn:a:b"c"}'), ("email", '{"s":""a"@b.co"}')]
)
def test_formats_that_break_json_strings(env, backend, fmt, bad):
    """outlines-core's time regex allows a backslash before any character (the invalid JSON escape
    ``"01:08:31\\*57"``, Glaiveai2K create_calendar_event), its uri regex a bare quote (MCPspec
    ResourceUpdatedNotification), its email regex a leading one: refused for outlines, enforced elsewhere."""
    how = _refused_or_enforced(env, backend, _obj({"type": "string", "format": fmt}), [bad], [], "format")
    assert how == ("refused" if backend == "outlines" else "enforced")
