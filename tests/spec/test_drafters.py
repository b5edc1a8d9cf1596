"""The drafters of runtime/spec (issue 27): prompt lookup, the occurrence index's suffix match and frequency
vote, the suffix drafter's per-request and global stores, the rest of a prompt word copied in other tokens,
and the fixed rule of the acceptance record."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from radixrt.runtime.spec import DraftConfig, NgramDrafter, SuffixDrafter, make_drafter, resolve_algorithm
from radixrt.runtime.spec.acceptance import LOW_ACCEPT, PROBE_EVERY, Acceptance
from radixrt.runtime.spec.ngram import lookup
from radixrt.runtime.spec.token_index import TokenIndex, draft_limit, vote_draft
from radixrt.runtime.spec.word_copy import WordCopy


def req(rid, prompt, out=()):
    return SimpleNamespace(rid=rid, input_ids=list(prompt), output_ids=list(out))


def test_lookup_takes_the_latest_longest_match():
    ctx = np.array([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # the last 2 tokens (2, 3) occur at 1 and 6: the latest (6) is continued by 7, 8, 5
    assert lookup(ctx, 5, 2, 3) == [7, 8, 5]
    # a longer suffix wins over a later short one: (5, 2, 3) nowhere, (1, 2, 3)... the suffix is (x, 2, 3)
    ctx = np.array([4, 2, 3, 6, 1, 2, 3, 7, 4, 2, 3])
    assert lookup(ctx, 5, 2, 2) == [6, 1]
    assert lookup(np.array([1, 2, 3, 4]), 5, 2, 4) == []


def test_token_index_match_length_and_vote():
    idx = TokenIndex(key_len=2)
    idx.extend(0, [5, 1, 2, 3, 4])
    idx.extend(1, [6, 1, 2, 3, 9])
    idx.extend(2, [7, 1, 2, 3, 9, 8])
    occ = idx.matches([0, 6, 1, 2, 3], max_depth=24)
    # every sequence holds (2, 3); only sequence 1 matches 4 tokens back (6, 1, 2, 3)
    assert sorted((pos, m) for _, pos, m in occ) == [(4, 3), (4, 3), (4, 4)]
    assert vote_draft(occ, 8, 0.1) == [9]
    # with 3 tokens matched by all, the vote picks 9 (two of three), then 8 (one of the two): 2/3 x 1/2
    occ = idx.matches([0, 1, 2, 3], max_depth=24)
    assert vote_draft(occ, 8, 0.1) == [9, 8]
    assert vote_draft(occ, 8, 0.5) == [9]
    assert draft_limit(3, 1.0, 8) == 3 and draft_limit(20, 1.0, 8) == 8 and draft_limit(3, 1.5, 8) == 5


def test_token_index_remove_and_rebuild():
    idx = TokenIndex(key_len=2)
    idx.extend(0, [1, 2, 3])
    idx.extend(1, [1, 2, 4, 5])
    idx.remove(1)
    assert idx.num_tokens == 3
    assert [s[p] for s, p, _ in idx.matches([9, 1, 2], 24)] == [3]
    idx.remove(0)  # stale entries now outnumber the live ones: rebuilt empty
    assert idx.index == {} and idx.matches([1, 2], 24) == []


def test_suffix_drafts_from_own_prompt_then_from_finished_outputs():
    d = SuffixDrafter(DraftConfig(num_draft_tokens=8))
    tool = [40, 41, 42, 43, 44, 45]
    r = req("a", [1, 2] + tool + [3, 4, 40, 41, 42])
    # matched (40, 41, 42): 3 tokens, so at most 3 drafted (spec_factor 1.0)
    assert d.draft(r) == [43, 44, 45]
    r.output_ids = [43, 44, 45, 50, 51, 52, 53]
    d.finish(r)
    assert "a" not in d.local and d.num_global_tokens == 8 + 7
    other = req("b", [9, 9, 9, 45, 50, 51, 52])
    assert d.draft(other) == [53]  # from the global store: (45, 50, 51, 52) matched, 53 followed
    d.flush()  # flush_cache: the store goes with the cache
    assert d.num_global_tokens == 0 and d.draft(req("c", [9, 9, 9, 45, 50, 51, 52])) == []


def test_suffix_global_store_is_bounded():
    d = SuffixDrafter(DraftConfig(global_tokens=20))
    for i in range(5):
        r = req(f"r{i}", [i], [100 + i] * 9)
        d.draft(r)
        d.finish(r)
    assert d.num_global_tokens <= 20 and len(d._order) == 2


def test_fixed_rule_shrinks_then_probes():
    """``--no-speculative-adaptive``: a request verifies the drafter's proposal scaled by ``min(1, 2 x share
    kept)`` (spec/acceptance.py, the record the cost model reads too); below ``LOW_ACCEPT`` after a few
    verifications, only every ``PROBE_EVERY``-th step drafts (a probe)."""
    d = NgramDrafter(DraftConfig(num_draft_tokens=8, ngram_min=2))
    r = req("x", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])
    a = Acceptance()
    assert a.fixed_scale("x") == 1.0  # share 0.5 at start: min(1, 2 x 0.5) keeps the whole proposal
    assert d.draft(r, share=a.fixed_scale("x")) == [3, 4, 5, 6, 7, 8, 9, 1]
    a.observe("x", 8, 2, True)
    assert a.fixed_scale("x") == pytest.approx(2 * (0.7 * 0.5 + 0.3 * 0.25))
    assert d.draft(r, share=a.fixed_scale("x")) == [3, 4, 5, 6, 7, 8]  # floor(8 x 2 x 0.425) = 6
    for _ in range(5):
        a.observe("x", 4, 0, True)
    share = 0.425 * 0.7**5
    assert share < LOW_ACCEPT
    got = [a.fixed_scale("x") for _ in range(PROBE_EVERY)]
    assert got[:-1] == [None] * (PROBE_EVERY - 1) and got[-1] == pytest.approx(2 * share)  # one probe
    assert d.draft(r, share=got[-1]) == [3]  # of floor(8 x 2 x share) = 1 token
    a.finish("x")
    assert a.fixed_scale("x") == 1.0


def test_make_drafter_names():
    assert make_drafter("none", DraftConfig()) is None
    assert isinstance(make_drafter("suffix", DraftConfig()), SuffixDrafter)
    with pytest.raises(ValueError, match="speculative_algorithm"):
        make_drafter("eagle", DraftConfig())


def test_auto_is_suffix_on_the_cpu_only_without_tp():
    assert resolve_algorithm("auto", 1, "cpu") == "suffix"
    assert resolve_algorithm("auto", 1, "cuda:0") == "none"  # never run on a GPU
    assert resolve_algorithm("auto", 2, "cpu") == "none"  # the TP lockstep carries no drafts
    assert [resolve_algorithm(a, 2, "cuda") for a in ("none", "suffix", "ngram")] == ["none", "suffix", "ngram"]


def test_word_copy_drafts_the_rest_of_a_prompt_word(tokenizer):
    """A value copied from prose into JSON changes its tokens (` Minsk` in the prompt, `"`, `M`, `ins`, `k`
    in the output): once the output has begun the word, the rest of the prompt's word is the draft."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc("Mei Okafor is a 43-year-old chemist who lives in Minsk.")
    w = WordCopy(tokenizer)
    draft = lambda out: w.draft(req("a", prompt, enc(out)))  # noqa: E731
    # "M" begins Mei and Minsk (one each): the latest; the rest is tokenized on its own
    assert draft('{"city":"M') == enc("insk") == [927, 91]
    # a word followed by a space and a word: both ("Mei" -> "i Okafor")
    assert draft('{"name":"Me') == enc("i Okafor")
    # no word begins with "Chem": ignoring case, "chemist"
    assert draft('{"job":"Chem') == enc("ist who")
    assert draft('{"age":4') == enc("3")
    # a whole word followed by "." has no rest; a word begun before the last 4 tokens may be a longer one
    assert draft('{"city":"Minsk') == []
    assert draft("Supercalifragilisticexpialidocious") == []
    # fewer than min_prob of the candidates agree: none (Mei and Minsk, 1/2 each)
    assert WordCopy(tokenizer, 0.6).draft(req("b", prompt, enc('{"city":"M'))) == []
    # the suffix drafter asks for it only where no suffix matches
    s = SuffixDrafter(DraftConfig(), tokenizer)
    assert s.draft(req("c", prompt, enc('{"city":"M'))) == enc("insk")
    assert s.draft(req("d", prompt, enc("Mei Okafor is a"))) == enc(" 43-year-old")  # the suffix's own draft
