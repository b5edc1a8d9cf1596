"""Soundness on the dev corpus (tests/data/jsonschema/dev, 120 schemas) with every backend, no model.

Each compiled schema gets seeded random walks through its token mask (``constrained/sample_walk.py``);
every walk that finishes (EOS accepted) must validate with ``jsonschema``. A refused schema must be a clear
ValueError naming the backend. Counts are pinned so that a change in either direction shows up. outlines-core
indexes some schemas for minutes, so it runs on the pinned schemas it compiles within a second.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from radixrt.runtime.constrained import create_backend
from radixrt.runtime.constrained.sample_walk import closer_ids, random_walk, schema_violation

DEV = Path(__file__).resolve().parents[1] / "data" / "jsonschema" / "dev"
# compiled / refused on the dev corpus (benchmarks/results/grammar_backends.md has the full table)
PINNED = {"llguidance": 108, "xgrammar": 98}
OUTLINES_FAST = (
    "Github_trivial__o17681",
    "Glaiveai2K__book_flight_f6de227e",
    "Glaiveai2K__calculate_area_033607ff",
    "Glaiveai2K__search_hotels_d2c27c8f",
    "Snowplow__sp_100_Normalized",
)
WALKS, MAX_TOKENS = 2, 160


@pytest.fixture(scope="module")
def env():
    from radixrt.runtime.models.loader import load_config, load_tokenizer

    tok = load_tokenizer()
    return tok, load_config().vocab_size


def _walk_corpus(env, backend: str, names=None, **kw):
    tok, vocab = env
    be = create_backend(backend, tok, vocab, **kw)
    closers = closer_ids(tok)
    compiled, refused, finished, invalid = 0, [], 0, []
    for path in sorted(DEV.glob("*.json")):
        if names is not None and path.stem not in names:
            continue
        text = path.read_text()
        try:
            grammar = be.compile("json_schema", text)
        except ValueError as e:
            assert str(e).startswith(f"{backend}: cannot compile json_schema: "), e
            refused.append(path.stem)
            continue
        compiled += 1
        for i in range(WALKS):
            w = random_walk(
                grammar, tok, vocab, be.eos_token_id, random.Random(f"{path.stem}/{i}"), closers, MAX_TOKENS
            )
            if w.finished:
                finished += 1
                why = schema_violation(w.text, json.loads(text))
                if why:
                    invalid.append((path.stem, w.text[:120], why))
    return compiled, refused, finished, invalid


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_dev_corpus_finished_walks_validate(env, backend):
    kw = {"dynamic_compilation": True} if backend == "xgrammar" else {}  # lazy masks: same grammar, faster
    compiled, refused, finished, invalid = _walk_corpus(env, backend, **kw)
    print(f"\n{backend}: compiled {compiled}/120, finished walks {finished}, invalid {len(invalid)}; refused {refused}")
    assert invalid == []
    assert compiled + len(refused) == 120 and finished > compiled // 2
    if PINNED.get(backend) is not None:
        assert compiled == PINNED[backend]


def test_dev_corpus_outlines_subset(env):
    compiled, refused, finished, invalid = _walk_corpus(env, "outlines", names=set(OUTLINES_FAST))
    assert invalid == [] and finished > 0 and compiled + len(refused) == len(OUTLINES_FAST)
