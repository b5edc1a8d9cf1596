"""Masks filled ahead on a worker thread and in one parallel llguidance call equal the per-row fills."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from radixrt.runtime.constrained import allocate_token_bitmask, create_backend
from radixrt.runtime.constrained.grammar_step import advance_matchers, build_grammar_mask
from radixrt.runtime.constrained.mask_fill import MaskPrefetcher, fill_rows

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)


@pytest.fixture(scope="module")
def env():
    from radixrt.runtime.models.loader import load_config, load_tokenizer

    tok = load_tokenizer()
    return tok, load_config().vocab_size


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_prefetched_masks_equal_fresh_ones(env, backend):
    tok, vocab = env
    compiled = create_backend(backend, tok, vocab).compile("json_schema", SCHEMA)
    texts = ['{"name":"Al","age":3}', '{"name":"Bo', '{"', '{"name":"Cy","age":12']
    reqs = [SimpleNamespace(grammar=compiled.matcher(), output_ids=[]) for _ in texts]
    reqs.insert(2, SimpleNamespace(grammar=None, output_ids=[]))  # an unconstrained row in between
    pre = MaskPrefetcher()
    steps = [tok.encode(t, add_special_tokens=False) for t in texts]
    for step in range(max(len(s) for s in steps)):
        live = [r for r in reqs if r.grammar is None or len(r.output_ids) < len(steps[_k(reqs, r)])]
        mask = build_grammar_mask(live, vocab, pre)
        fresh = allocate_token_bitmask(len(mask.rows), vocab)
        for j, i in enumerate(mask.rows):
            live[i].grammar.fill_next_token_bitmask(fresh, j)
        assert torch.equal(mask.bitmask, fresh), step
        toks = [0 if r.grammar is None else steps[_k(reqs, r)][len(r.output_ids)] for r in live]
        advance_matchers(live, toks)
        for r, t in zip(live, toks):
            r.output_ids.append(t)
        pre.start(live, vocab)
    assert pre.prefetched > 0 and pre.used > 0
    pre.shutdown()


def _k(reqs, r):
    """Index of ``r`` among the constrained requests (the unconstrained one has no text)."""
    return [x for x in reqs if x.grammar is not None].index(r)


def test_parallel_fill_equals_row_fill(env):
    tok, vocab = env
    be = create_backend("llguidance", tok, vocab)
    ms = [be.compile("json_schema", SCHEMA).matcher() for _ in range(5)] + [be.compile("regex", "[0-9]+").matcher()]
    for i, m in enumerate(ms[:5]):
        for t in tok.encode('{"name":"Al","age":3'[: 3 * i + 1], add_special_tokens=False):
            assert m.accept_token(t)
    par, one = allocate_token_bitmask(len(ms), vocab), allocate_token_bitmask(len(ms), vocab)
    fill_rows([(m, j) for j, m in enumerate(ms)], par)
    for j, m in enumerate(ms):
        m.fill_next_token_bitmask(one, j)
    assert torch.equal(par, one) and not torch.equal(par[0], par[1])


def test_overlap_engine_outputs_match(engine):
    """``grammar_overlap`` on: the same greedy constrained outputs (token ids) as the session engine (off)."""
    from conftest import close_engine, make_engine

    prompts = [f"Describe person {i} as JSON:" for i in range(4)]
    sp = {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 40}
    off = engine.generate(prompts, [dict(sp) for _ in prompts])
    on_engine = make_engine(grammar_overlap=True)
    try:
        on = on_engine.generate(prompts, [dict(sp) for _ in prompts])
        prefetch = on_engine.scheduler.outputs.mask_prefetcher
    finally:
        close_engine(on_engine)
    assert [o["text"] for o in on] == [o["text"] for o in off]
    assert all(
        json.loads(o["text"])["age"] is not None for o in off if o["meta_info"]["finish_reason"]["type"] == "stop"
    )
    assert prefetch is not None, "grammar_overlap=True built no mask prefetcher"
    assert prefetch.used > 0
