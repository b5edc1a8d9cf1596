"""Draftless speculative decoding: drafters that propose the next tokens from token history already held.

A drafter proposes draft token ids for a running request (:class:`~radixrt.runtime.spec.base.Drafter`);
the scheduler scores them in one forward and keeps the accepted prefix (runtime/scheduler/spec_step.py).
This package sees requests only through ``rid``, ``input_ids`` and ``output_ids`` and imports nothing else
of radixrt (pyproject.toml's layer contracts).

    ngram   prompt lookup: the latest earlier occurrence of the context's last n tokens (ngram.py)
    suffix  frequency-weighted continuations of the longest matched suffix, over the request's own
            tokens and a bounded global store of recent outputs (suffix.py, token_index.py); where none
            matches, the rest of a prompt word the output has begun in other tokens (word_copy.py)
"""

from __future__ import annotations

from radixrt.runtime.spec.base import Drafter, DraftConfig
from radixrt.runtime.spec.ngram import NgramDrafter
from radixrt.runtime.spec.suffix import SuffixDrafter

ALGORITHMS = ("none", "suffix", "ngram")


def resolve_algorithm(name: str, tp: int, device: str) -> str:
    """``--speculative-algorithm auto``: ``suffix`` on the CPU without tensor parallelism (it won or tied
    every workload of benchmarks/bench_spec.py there), ``none`` on CUDA (never run on a GPU) and under
    ``--tp`` (the ranks' lockstep carries no drafts). Any other name is returned as given."""
    if name != "auto":
        return name
    return "suffix" if tp == 1 and str(device).startswith("cpu") else "none"


def make_drafter(algorithm: str, cfg: DraftConfig, tokenizer=None) -> Drafter | None:
    """The drafter named by ``--speculative-algorithm`` (None for ``none``); ``tokenizer`` (the model's)
    lets ``suffix`` also draft the rest of prompt words copied in other tokens (word_copy.py).

    Raises:
        ValueError: an unknown algorithm name.
    """
    if algorithm == "none":
        return None
    if algorithm == "ngram":
        return NgramDrafter(cfg)
    if algorithm == "suffix":
        return SuffixDrafter(cfg, tokenizer)
    raise ValueError(f"speculative_algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


__all__ = ["ALGORITHMS", "Drafter", "DraftConfig", "NgramDrafter", "SuffixDrafter", "make_drafter", "resolve_algorithm"]
