"""The draft rows' verification (scheduler/spec_verify.py): plain greedy rows take one argmax over all their
positions and never enter the sampler; the tokens, finish reasons and counts equal those of the
position-by-position path, for a full accept, a mismatch, EOS, a stop string and the length limit."""

from __future__ import annotations

import torch

from radixrt.runtime.executor.scheduled_batch import Row
from radixrt.runtime.io_struct import SamplingParams
from radixrt.runtime.scheduler.output_processor import OutputProcessor
from radixrt.runtime.scheduler.request import Req
from radixrt.runtime.scheduler.spec_verify import plain_greedy, verify_levels, verify_rows

EOS = 2
V = 64


def make(rid: str, draft: list[int], out=(), **sp) -> Row:
    """A decode row of request ``rid`` carrying ``draft``."""
    p = SamplingParams(**{"temperature": 0.0, **sp})
    r = Req(rid, [7, 8, 9], p, sp.get("max_new_tokens", 128), generator=torch.Generator().manual_seed(0))
    r.output_ids = list(out)
    return Row(r, 1 + len(draft), list(draft))


def logits_for(rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """fp32 logits whose row argmaxes are the given tokens, row blocks in order; returns the first rows."""
    g = torch.Generator().manual_seed(1)
    flat = [t for r in rows for t in r]
    x = torch.rand(len(flat), V, generator=g)
    x[torch.arange(len(flat)), torch.tensor(flat)] = 5.0
    firsts, at = [], 0
    for r in rows:
        firsts.append(at)
        at += len(r)
    return x, firsts


def cases():
    # (draft, argmax per position, extra sampling params, output so far)
    return [
        ([11, 12, 13], [11, 12, 13, 14], {}, ()),  # all kept + the bonus token
        ([11, 12, 13], [11, 30, 13, 14], {}, ()),  # mismatch at 2: 11 kept, 30 ends the row
        ([11, EOS, 13], [11, EOS, 13, 14], {}, ()),  # EOS accepted as a draft finishes the row
        ([11, 12, 13], [11, 12, 13, 14], {"max_new_tokens": 3}, (5,)),  # length after 2 tokens
        ([40, 41, 42], [40, 41, 42, 43], {"stop": ["B"]}, ()),
    ]  # a stop string after the 2nd


class Tok:
    """Decodes token 41 as "B" (the stop string of the last case), anything else as "a"."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("B" if t == 41 else "a" for t in ids)


def run(fast: bool, monkeypatch=None):
    outputs = OutputProcessor(Tok(), {EOS}, 4096)
    calls = []
    if monkeypatch is not None:
        orig = outputs.sample
        monkeypatch.setattr(outputs, "sample", lambda *a: calls.append(1) or orig(*a))
    rows = [make(f"r{i}", d, out, **sp) for i, (d, _, sp, out) in enumerate(cases())]
    reqs = [row.req for row in rows]
    logits, firsts = logits_for([a for _, a, _, _ in cases()])
    verify_at = list(zip(rows, firsts))
    if fast:
        finished, sampled, accepted = verify_rows(outputs, logits, verify_at)
    else:
        sampled, accepted = {}, {}
        finished = verify_levels(outputs, logits, verify_at, sampled, accepted)
    return (
        [r.output_ids for r in reqs],
        sorted((r.rid, why.as_dict()) for r, why in finished),
        [sampled[id(r)] for r in reqs],
        [accepted[id(r)] for r in reqs],
        calls,
    )


def test_greedy_rows_skip_the_sampler_and_match_the_level_path(monkeypatch):
    out, fin, sampled, accepted, calls = run(True, monkeypatch)
    assert calls == []  # every row is plain greedy: no sampler call
    assert out == [[11, 12, 13, 14], [11, 30], [11, EOS], [5, 11, 12], [40, 41]]
    assert sampled == [4, 2, 2, 2, 2] and accepted == [3, 1, 2, 2, 2]
    assert fin == [
        ("r2", {"type": "stop", "matched": 2}),
        ("r3", {"type": "length", "length": 3}),
        ("r4", {"type": "stop", "matched": "B"}),
    ]
    assert run(False)[:4] == (out, fin, sampled, accepted)


def test_plain_greedy_excludes_what_changes_logits():
    assert plain_greedy(make("a", []).req)
    assert not plain_greedy(make("a", [], temperature=0.7).req)
    assert not plain_greedy(make("a", [], repetition_penalty=1.1).req)
    assert not plain_greedy(make("a", [], min_new_tokens=3, max_new_tokens=8).req)
    assert plain_greedy(make("a", [], (1, 2, 3), min_new_tokens=3, max_new_tokens=8).req)
    r = make("a", []).req
    r.return_logprob = True
    assert not plain_greedy(r)
