"""Jump-forward decoding (issue 15, part 2): grammar-forced text is appended in one extend step, with the
boundary retokenized as the tokenizer would write it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixrt.runtime.constrained import create_backend
from radixrt.runtime.io_struct import SamplingParams
from radixrt.runtime.scheduler.jump_forward import forced_tokens, try_jump_forward
from radixrt.runtime.scheduler.request import Req

from conftest import close_engine, make_engine, wait_idle

SCHEMA = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 999},
        "shipping_address_line": {"type": "string", "maxLength": 12},
        "preferred_delivery_weekday": {"type": "string", "enum": ["Monday", "Friday"]},
    },
    "required": ["customer_identification_number", "shipping_address_line", "preferred_delivery_weekday"],
    "additionalProperties": False,
}
PROMPT = (
    "<|im_start|>user\nCustomer 417 lives at 9 Elm Road and wants parcels on Fridays. Reply with JSON."
    "<|im_end|>\n<|im_start|>assistant\n"
)


def enc(tok, s: str) -> list[int]:
    return tok.encode(s, add_special_tokens=False)


@pytest.fixture(scope="module")
def grammar(tokenizer):
    be = create_backend("xgrammar", tokenizer, len(tokenizer))
    return be.compile("json_schema", json.dumps(SCHEMA))


def test_forced_tokens_retokenize_the_boundary(tokenizer):
    # "{" sampled, '"customer_identification_number":' forced: the tokenizer writes '{"' as one token, and the
    # last word ('":') is held back for the model to decode.
    got = forced_tokens(tokenizer, enc(tokenizer, "{")[0], '"customer_identification_number":')
    assert got == enc(tokenizer, '{"customer_identification_number')
    assert tokenizer.convert_ids_to_tokens(got)[:2] == ['{"', "customer"]
    # Nothing but the held-back word: no jump.
    assert forced_tokens(tokenizer, enc(tokenizer, "{")[0], '"') is None
    # A head token that is part of a UTF-8 character is never joined.
    part = enc(tokenizer, "é")
    if len(part) == 1:
        part = [t for t in enc(tokenizer, "日本") if "\ufffd" in tokenizer.decode([t])]
    assert part and forced_tokens(tokenizer, part[0], '"abc_def":') is None


def test_try_jump_forward_updates_matcher_and_output(tokenizer, grammar):
    m = grammar.matcher()
    req = Req("jf", [1], SamplingParams(), 64)
    req.grammar = m
    for t in enc(tokenizer, '{"customer_identification_number":417'):
        assert m.accept_token(t)
        req.output_ids.append(t)
    comma = enc(tokenizer, ",")[0]
    assert m.accept_token(comma)
    req.output_ids.append(comma)
    before = list(req.output_ids[:-1])
    added = try_jump_forward(req, tokenizer, room=64)
    # ',' + '"shipping_address_line":"' -> ',"' 'sh' 'ipping' '_' 'address' '_' 'line', '":"' held back
    assert req.output_ids == before + enc(tokenizer, ',"shipping_address_line')
    assert added == len(enc(tokenizer, ',"shipping_address_line')) - 1 == 6
    assert m.find_jump_forward_string() == '":"'
    # room caps what is added
    m2 = grammar.matcher()
    req2 = Req("jf2", [1], SamplingParams(), 64)
    req2.grammar = m2
    brace = enc(tokenizer, "{")[0]
    assert m2.accept_token(brace)
    req2.output_ids.append(brace)
    assert try_jump_forward(req2, tokenizer, room=2) == 2
    assert req2.output_ids == enc(tokenizer, '{"customer_identification_number')[:3]


def _run(e, tokenizer):
    before = e.get_server_info()["cache"]
    out = e.generate(
        input_ids=enc(tokenizer, PROMPT),
        sampling_params={"max_new_tokens": 96, "temperature": 0, "json_schema": json.dumps(SCHEMA)},
    )
    after = wait_idle(e)
    passes = after["req_forward_passes"] - before["req_forward_passes"]
    jumped = after["jump_forward_tokens"] - before["jump_forward_tokens"]
    return out, passes, jumped


def test_fewer_forward_passes_than_output_tokens(tokenizer):
    # speculation off in both: its drafts would also cut the passes (tests/constrained/test_spec_grammar.py)
    results = {}
    for jump in (True, False):
        e = make_engine(max_total_tokens=2048, disable_jump_forward=not jump, speculative_algorithm="none")
        try:
            results[jump] = _run(e, tokenizer)
        finally:
            close_engine(e)
    (out_on, passes_on, jumped_on), (out_off, passes_off, jumped_off) = results[True], results[False]
    for out in (out_on, out_off):
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
    n_on = out_on["meta_info"]["completion_tokens"]
    n_off = out_off["meta_info"]["completion_tokens"]
    # Off: one forward pass per output token (the prefill samples the first). On: the forced keys ride along.
    assert passes_off == n_off and jumped_off == 0
    assert passes_on == n_on - jumped_on and jumped_on >= 15
    assert passes_on < n_on
    # The first key was retokenized as the tokenizer writes it.
    k = enc(tokenizer, '{"customer_identification_number')
    assert out_on["output_ids"][: len(k)] == k
