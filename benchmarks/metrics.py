"""Per-request records and the serving metrics, defined as SGLang's and vLLM's ``bench_serving`` define them.

For one workload on one system, over the completed requests (``duration`` = last finish - first send):

- request throughput = completed / duration; input tok/s = prompt tokens / duration;
  output tok/s = output tokens / duration;
- TTFT = first streamed token's arrival - send (mean, P50, P99). A ``select`` streams nothing: its TTFT
  is its end-to-end latency;
- TPOT = (e2e - TTFT) / (output tokens - 1), per request with more than one output token (mean, P50, P99);
- ITL = the gaps between consecutive streamed chunks, pooled over all requests (mean, P50, P99);
- e2e latency = finish - send (mean, P50, P99);
- hit rate = cached / prompt tokens, as the system reports them (None where it reports nothing), next to the
  optimal hit rate: what an ideal token-level cache that keeps every prompt and, once a request finishes,
  its output, could reuse in the order the requests were sent (:func:`optimal_hit_rate`), and the same
  counting whole 16-token pages only (radixrt's page size: what a paged cache can reach at best);
- JSON validity share = outputs that parse and validate against the workload's schema / those checked.

Percentiles interpolate linearly (numpy's default), as ``roofline.percentile`` does.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import percentile  # noqa: E402


@dataclass
class Record:
    """One call (a ``gen`` or a ``select``) as the client saw it. Times are ``time.perf_counter()`` seconds."""

    workload: str
    system: str
    program: int
    step: int
    kind: str  # "gen" | "select"
    t_send: float
    t_end: float
    t_first: Optional[float] = None  # first chunk carrying a token (select: None -> t_end)
    chunk_times: list[float] = field(default_factory=list)  # arrival of every chunk that carried tokens
    prompt_tokens: int = 0  # the workload's prompt tokens (the same for every system)
    output_tokens: int = 0
    reported_prompt_tokens: Optional[int] = None  # as the system counted them (hit-rate denominator)
    cached_tokens: Optional[int] = None  # None: the system does not say
    output_text: str = ""
    finish_reason: Optional[str] = None
    json_valid: Optional[bool] = None
    decision: Optional[str] = None  # select: the chosen option
    label: Optional[str] = None  # select: the template's answer
    error: Optional[str] = None
    sent_ids: Optional[list[int]] = None  # the token ids sent, where the client tokenized
    output_ids: Optional[list[int]] = None  # the token ids generated, where the system returns them

    @property
    def ttft(self) -> float:
        return (self.t_first if self.t_first is not None else self.t_end) - self.t_send

    @property
    def e2e(self) -> float:
        return self.t_end - self.t_send

    @property
    def tpot(self) -> Optional[float]:
        if self.output_tokens <= 1 or self.t_first is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        c = self.chunk_times
        return [b - a for a, b in zip(c, c[1:])]


def stats(xs: list[float]) -> dict:
    """mean, P50 and P99 (None for an empty list)."""
    if not xs:
        return {"mean": None, "p50": None, "p99": None, "n": 0}
    return {"mean": sum(xs) / len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99), "n": len(xs)}


def summarize(records: list[Record], optimal: Optional[float] = None, optimal_paged: Optional[float] = None) -> dict:
    """The workload's figures on one system (see the module docstring)."""
    ok = [r for r in records if r.error is None]
    out: dict[str, Any] = {"completed": len(ok), "failed": len(records) - len(ok)}
    if not ok:
        return out
    duration = max(r.t_end for r in ok) - min(r.t_send for r in ok)
    duration = max(duration, 1e-9)
    n_in = sum(r.prompt_tokens for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    out.update(
        {
            "duration_s": duration,
            "total_input_tokens": n_in,
            "total_output_tokens": n_out,
            "request_throughput": len(ok) / duration,
            "input_throughput": n_in / duration,
            "output_throughput": n_out / duration,
            "total_throughput": (n_in + n_out) / duration,
            "ttft_s": stats([r.ttft for r in ok]),
            "tpot_s": stats([t for t in (r.tpot for r in ok) if t is not None]),
            "itl_s": stats([x for r in ok for x in r.itls]),
            "e2e_s": stats([r.e2e for r in ok]),
        }
    )
    rep = [r for r in ok if r.cached_tokens is not None]
    if rep:
        den = sum(r.reported_prompt_tokens if r.reported_prompt_tokens is not None else r.prompt_tokens for r in rep)
        out["hit_rate"] = sum(r.cached_tokens for r in rep) / max(den, 1)
    else:
        out["hit_rate"] = None
    out["optimal_hit_rate"] = optimal
    out["optimal_hit_rate_paged"] = optimal_paged
    checked = [r for r in ok if r.json_valid is not None]
    out["json_valid_share"] = (sum(r.json_valid for r in checked) / len(checked)) if checked else None
    sel = [r for r in ok if r.kind == "select" and r.label is not None]
    out["select_accuracy"] = (sum(r.decision == r.label for r in sel) / len(sel)) if sel else None
    return out


class _Trie:
    """Token-id trie: ``match`` = the longest prefix of a sequence already inserted."""

    def __init__(self) -> None:
        self.root: dict = {}

    def match(self, seq: list[int]) -> int:
        node, n = self.root, 0
        for t in seq:
            node = node.get(t)
            if node is None:
                break
            n += 1
        return n

    def insert(self, seq: list[int]) -> None:
        node = self.root
        for t in seq:
            node = node.setdefault(t, {})


def optimal_hit_rate(
    events: Iterable[tuple[float, float, list[list[int]], Optional[list[int]]]], page: int = 1
) -> Optional[float]:
    """The hit rate of an ideal, unbounded, token-granular prefix cache.

    ``events``: one ``(t_send, t_end, sent, done)`` per call: ``sent`` the token sequences the call sends
    (one prompt, or one per ``select`` option) and ``done`` the sequence the cache could hold once it finished
    (prompt + output), or None. Each sent sequence reuses its longest prefix among every sequence sent before it
    and every ``done`` of a call finished before it was sent; sequences of one call are sent in order.
    Returns reused / sent tokens. ``page`` > 1: a reused prefix counts in whole pages only (a paged cache's
    optimum, radixrt's with ``page`` = its page size).
    """
    timeline = []
    for i, (t0, t1, sent, done) in enumerate(events):
        timeline.append((t0, 1, i, sent))
        if done is not None:
            timeline.append((t1, 0, i, [done]))  # at equal times a finish comes before a send
    timeline.sort(key=lambda e: (e[0], e[1], e[2]))
    trie, hit, total = _Trie(), 0, 0
    for _, is_send, _, seqs in timeline:
        for s in seqs:
            if is_send:
                hit += trie.match(s) // page * page
                total += len(s)
            trie.insert(s)
    return hit / total if total else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b
