"""Batched sampling. Order per row: penalties -> logit bias -> grammar mask -> temperature -> top-k/top-p/min-p
-> sample.

Logprobs are those of the model's own distribution (log-softmax of the raw logits). Each request owns a
``torch.Generator``, so a seeded request draws the same tokens whatever else shares its batch.
Penalties follow OpenAI (frequency/presence, over output tokens) and CTRL/HF (repetition, over prompt and
output: positive logits divided, negative multiplied).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels import fused
from radixrt.runtime.io_struct import SamplingParams


@dataclass
class SampleRow:
    """What the sampler needs of one request."""

    params: SamplingParams
    generator: torch.Generator
    prompt_ids: list[int]
    output_ids: list[int]
    block_ids: list[int]  # tokens masked out (EOS/stop ids while below min_new_tokens)
    top_logprobs_num: int = 0
    want_logprob: bool = False


@dataclass
class SampleOut:
    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[float, int]] | None]


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    for i, r in enumerate(rows):
        p = r.params
        if (p.frequency_penalty or p.presence_penalty) and r.output_ids:
            ids, counts = torch.tensor(r.output_ids).unique(return_counts=True)
            ids = ids.to(logits.device)
            logits[i, ids] -= p.frequency_penalty * counts.to(logits.device, logits.dtype) + p.presence_penalty
        if p.repetition_penalty != 1.0:
            ids = torch.tensor(sorted(set(r.prompt_ids) | set(r.output_ids)), device=logits.device)
            vals = logits[i, ids]
            logits[i, ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)


def _apply_logit_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """OpenAI/SGLang ``logit_bias``: add each request's ``{token id: bias}`` to its row of logits."""
    for i, r in enumerate(rows):
        bias = r.params.logit_bias
        if bias:
            ids = torch.tensor(list(bias), device=logits.device)
            logits[i, ids] += torch.tensor(list(bias.values()), device=logits.device, dtype=logits.dtype)


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Top-k, top-p (nucleus, Holtzman et al. 2019) and min-p on one row of temperature-scaled logits."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest set whose mass reaches top_p
        logits = logits.clone()
        logits[idx[drop]] = float("-inf")
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


@torch.inference_mode()  # logits may be the model's own (inference) tensor, changed in place here
def sample(logits: torch.Tensor, rows: list[SampleRow], grammar_mask=None) -> SampleOut:
    """Sample one token per row.

    Args:
        logits: fp32 ``[B, vocab]`` (modified in place).
        rows: B request descriptions.
        grammar_mask: optional :class:`~radixrt.runtime.constrained.grammar_step.GrammarMask`; its
            ``apply_(logits)`` sets -inf on grammar-illegal tokens of the constrained rows (unconstrained
            rows pay nothing).
    """
    need_lp = any(r.want_logprob or r.top_logprobs_num for r in rows)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if need_lp else None
    _apply_penalties(logits, rows)
    _apply_logit_bias(logits, rows)
    for i, r in enumerate(rows):
        if r.block_ids:
            logits[i, r.block_ids] = float("-inf")
    if grammar_mask is not None:
        grammar_mask.apply_(logits)
    tokens: list[int] = []
    greedy = [i for i, r in enumerate(rows) if r.params.temperature == 0.0]
    argmax = fused.argmax(logits).tolist() if greedy else None
    for i, r in enumerate(rows):
        p = r.params
        if p.temperature == 0.0:
            tokens.append(argmax[i])
            continue
        row = _filter(logits[i] / p.temperature, p.top_k, p.top_p, p.min_p)
        probs = row.softmax(-1)
        if not torch.isfinite(probs).all() or probs.sum() <= 0:  # everything masked: fall back to argmax
            tokens.append(int(logits[i].argmax()))
            continue
        tokens.append(int(torch.multinomial(probs.cpu(), 1, generator=r.generator)))
    lps: list[float | None] = [None] * len(rows)
    tops: list[list[tuple[float, int]] | None] = [None] * len(rows)
    if need_lp:
        chosen = raw_logprobs[torch.arange(len(rows)), torch.tensor(tokens, device=logits.device)].tolist()
        for i, r in enumerate(rows):
            if r.want_logprob:
                lps[i] = chosen[i]
            if r.top_logprobs_num:
                v, ix = raw_logprobs[i].topk(r.top_logprobs_num)
                tops[i] = list(zip(v.tolist(), ix.tolist()))
    return SampleOut(tokens, lps, tops)
