"""Speculative decoding under a grammar (issue 27): drafts are cut to the prefix the matcher accepts (and the
matcher rolled back), verification samples under the mask, so constrained outputs are the same tokens as
without speculation, greedy and seeded, with jump-forward on too, on schemas of the dev corpus."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from radixrt.runtime.constrained import create_backend
from radixrt.runtime.constrained.base import allocate_token_bitmask
from radixrt.runtime.scheduler.spec_drafts import DraftMaker, grammar_prefix
from radixrt.runtime.spec import DraftConfig

from conftest import close_engine, make_engine, DATA

PROMPT = "Generate a JSON object that matches the schema:\n{schema}\nJSON:"
EVERY = 12  # every 12th dev schema the default backend compiles (8 or 9 of 108)
# drafts that do not depend on the wall clock: no cost model (it times the steps), the draft length pinned
FIXED = {"speculative_adaptive": False, "speculative_num_draft_tokens": 24}


def enc(tok, s: str) -> list[int]:
    return tok.encode(s, add_special_tokens=False)


def test_forced_tokens_of_a_schema(tokenizer):
    be = create_backend("llguidance", tokenizer, len(tokenizer))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    m = be.compile("json_schema", json.dumps(schema)).matcher()
    for t in enc(tokenizer, '{"name":"Ann"'):
        assert m.accept_token(t)
    # after the name's closing quote the grammar allows only ,"age": (compact separators); llguidance
    # forces the tokens that cannot merge with what follows: ,"age, not the '":' (one token or two)
    assert tokenizer.decode(m.forced_tokens()) == ',"age'
    for t in m.forced_tokens():
        assert m.accept_token(t)
    assert m.forced_tokens() == [] and m.find_jump_forward_string() == '":'


def test_grammar_prefix_cuts_and_rolls_back(tokenizer):
    be = create_backend("llguidance", tokenizer, len(tokenizer))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    m = be.compile("json_schema", json.dumps(schema)).matcher()
    for t in enc(tokenizer, '{"name'):
        assert m.accept_token(t)
    before = allocate_token_bitmask(1, len(tokenizer))
    m.fill_next_token_bitmask(before, 0)
    good = enc(tokenizer, '":"Bob"}')  # compact JSON (any_whitespace off)
    bad = enc(tokenizer, "]")
    assert tokenizer.convert_ids_to_tokens(good) == ['":"', "Bob", '"}']
    assert grammar_prefix(m, good[:2] + bad + good[2:]) == good[:2] + bad + good[2:]  # "Bob]" is a string
    assert grammar_prefix(m, good + bad + good) == good  # nothing may follow the closed object
    after = allocate_token_bitmask(1, len(tokenizer))
    m.fill_next_token_bitmask(after, 0)
    assert torch.equal(before, after)  # the matcher is where it was
    assert grammar_prefix(m, bad) == []
    # an end token ends the prefix unchecked and is never fed to the matcher (its mask is the verifier's)
    eos = tokenizer.eos_token_id
    assert grammar_prefix(m, good + [eos] + good, {eos}) == good + [eos]
    m.fill_next_token_bitmask(after, 0)
    assert torch.equal(before, after)


def maker(tokenizer, drafter=None) -> DraftMaker:
    outputs = SimpleNamespace(tokenizer=tokenizer, eos_ids={tokenizer.eos_token_id}, mask_prefetcher=None)
    return DraftMaker(drafter or SimpleNamespace(cfg=DraftConfig()), outputs, 2048, adaptive=True)


def row(m, out=()) -> SimpleNamespace:
    """A decode row under matcher ``m``, with room for 8 drafts (DraftMaker.room)."""
    return SimpleNamespace(
        rid="r",
        grammar=m,
        input_ids=[1, 2],
        output_ids=list(out),
        max_new_tokens=64,
        seq_len=8,
        page_table=[0],
        num_computed=8,
        params=SimpleNamespace(speculative=True, stop_token_ids=[]),
    )


def test_forced_text_drafted_where_no_token_is_certain(tokenizer):
    """llguidance forces no token where the free text after it could join it (the `"` before a string value,
    the `":` after a key); the forced text's own tokens are drafted there, and the matcher stays put."""
    be = create_backend("llguidance", tokenizer, len(tokenizer))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    m = be.compile("json_schema", json.dumps(schema)).matcher()
    dm = maker(tokenizer)
    for t in enc(tokenizer, '{"name":'):
        assert m.accept_token(t)
    assert m.forced_tokens() == [] and m.find_jump_forward_string() == '"'
    assert dm.forced(row(m), 8) == enc(tokenizer, '"')
    assert dm.forced(row(m), 0) == []
    for t in enc(tokenizer, '"Ann",'):
        assert m.accept_token(t)
    # where llguidance forces tokens, those alone (the held-back '":' comes as the step's own token)
    assert dm.forced(row(m), 8) == m.forced_tokens() == enc(tokenizer, '"age')
    assert m.find_jump_forward_string() == '"age":'


def test_forced_tokens_then_the_drafters_proposal_after_them(tokenizer):
    """Where the drafter's own proposal does not begin with the forced tokens, it is asked again for the
    context followed by them; the forced tokens count as certain, the grammar cuts the rest."""
    be = create_backend("llguidance", tokenizer, len(tokenizer))
    m = be.compile("json_schema", json.dumps(TOOL)).matcher()
    call = enc(tokenizer, '{"tool":"run_tests","path":"src"}')
    forced = m.forced_tokens()
    assert forced == call[:3]  # {"tool":" (the enum's values follow)
    asked = []

    def draft(req, after=(), share=1.0):  # Drafter.draft: the adaptive path asks for the whole proposal
        asked.append(list(after))
        return call[len(after) :] + enc(tokenizer, "]]") if after else enc(tokenizer, "Sure")

    dm = maker(tokenizer, SimpleNamespace(cfg=DraftConfig(), draft=draft))
    req_pages = SimpleNamespace(allocator=SimpleNamespace(num_free=8), P=16)
    d = dm.continued(row(m), req_pages, 64, 1, forced)
    assert asked == [[], forced]
    # room 8: the forced tokens and 6 of the call after them ("]]" would fail the grammar, but is not reached)
    assert d.certain == len(forced) and d.tokens == call[:8]
    # a proposal that begins with the forced tokens is taken as it is
    dm = maker(tokenizer, SimpleNamespace(cfg=DraftConfig(), draft=lambda req, after=(), share=1.0: call[len(after) :]))
    assert dm.continued(row(m), req_pages, 64, 1, forced).tokens == call[:8]
    assert dm.continued(row(m), req_pages, 64, 1, []).certain == 0


def corpus(engine) -> list[str]:
    texts = []
    for f in sorted((DATA / "jsonschema" / "dev").glob("*.json")):
        try:
            engine.grammar_check("json_schema", f.read_text())
            texts.append(f.read_text())
        except ValueError:
            pass
    return texts[::EVERY]


def requests(tok, schemas: list[str]) -> tuple[list[str], list[dict]]:
    prompts, sps = [], []
    for text in schemas:
        cut = tok.decode(enc(tok, json.dumps(json.loads(text), separators=(",", ":")))[:48])
        for sp in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
            prompts.append(PROMPT.format(schema=cut))
            sps.append({**sp, "json_schema": text, "max_new_tokens": 64})
    return prompts, sps


@pytest.mark.parametrize("jump_forward", [False, True])
def test_constrained_outputs_identical_and_valid(tokenizer, jump_forward):
    kw = dict(disable_jump_forward=not jump_forward, speculative_max_batch_size=64, **FIXED)
    off = make_engine(speculative_algorithm="none", **kw)
    try:
        schemas = corpus(off)
        assert len(schemas) >= 8
        prompts, sps = requests(tokenizer, schemas if not jump_forward else schemas[:4])
        want = off.generate(prompts, sps)
    finally:
        close_engine(off)
    on = make_engine(speculative_algorithm="suffix", **kw)
    try:
        got = on.generate(prompts, sps)
        st = on.get_server_info()["cache"]["speculative"]
    finally:
        close_engine(on)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert st["accepted_tokens"] > 0
    # the tokens the grammar forces (keys, punctuation) were drafted and mostly kept (with jump-forward on,
    # it appends most of them first)
    assert (
        jump_forward or st["forced_draft_tokens"] > 20 and st["forced_accepted_tokens"] > st["forced_draft_tokens"] // 2
    )
    finished = 0
    for sp, o in zip(sps, got):
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            schema = json.loads(sp["json_schema"])
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls(schema, format_checker=None).validate(json.loads(o["text"]))
            finished += 1
    if not jump_forward:  # 9 of 18 finish within 64 tokens; with jump-forward (forced tokens count) none of 8
        assert finished >= len(sps) // 3


TOOL = {
    "type": "object",
    "properties": {
        "tool": {"type": "string", "enum": ["read_file", "run_tests"]},
        "path": {"type": "string", "maxLength": 32},
    },
    "required": ["tool", "path"],
    "additionalProperties": False,
}
CALL_PROMPT = (
    "<|im_start|>system\nCall one tool as JSON: read_file(path) or run_tests(path).<|im_end|>\n"
    "<|im_start|>user\nRead src/app/main.py.<|im_end|>\n<|im_start|>assistant\n"
)


def test_forced_tokens_continued_by_the_drafter():
    """The grammar forces a tool call's opening up to the tool's name ({"tool":"); the drafter's store holds the
    same call answered before, so the forced tokens continue with it: the repeated call takes 2 passes
    (prefill + 1 step), not 3 (forced drafts alone end at the name), and the tokens do not change."""
    sp = {"temperature": 0, "max_new_tokens": 24, "json_schema": json.dumps(TOOL)}
    off = make_engine(speculative_algorithm="none")
    try:
        want = off.generate(CALL_PROMPT, sp)
    finally:
        close_engine(off)
    assert want["text"] == '{"tool":"run_tests","path":"src/app/main.py"}'
    on = make_engine(speculative_algorithm="suffix", **FIXED)
    try:
        on.flush_cache()
        keys = ("verify_steps", "draft_tokens", "accepted_tokens", "forced_draft_tokens")
        got = []
        for _ in range(2):
            c0 = on.get_server_info()["cache"]
            out = on.generate(CALL_PROMPT, sp)
            c1 = on.get_server_info()["cache"]
            assert out["output_ids"] == want["output_ids"]
            got.append(
                (
                    c1["req_forward_passes"] - c0["req_forward_passes"],
                    {k: c1["speculative"][k] - c0["speculative"][k] for k in keys},
                )
            )
    finally:
        close_engine(on)
    # first: the forced drafts (7 tokens) and the request's own prompt ("src/app/main.py")
    assert got[0] == (8, {"verify_steps": 4, "draft_tokens": 12, "accepted_tokens": 10, "forced_draft_tokens": 7})
    # again: the prefill row drafts the forced opening and the earlier answer after it (17 tokens, all kept;
    # the first 3 forced: {"tool":")
    assert got[1] == (2, {"verify_steps": 2, "draft_tokens": 17, "accepted_tokens": 17, "forced_draft_tokens": 3})
