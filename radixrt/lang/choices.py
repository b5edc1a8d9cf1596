"""``select``: score every choice from input-token logprobs of ONE batched, prefill-only request.

The context and ``context + choice`` are tokenized on the client (the server's tokenizer, no special
tokens), so token boundaries are exact: when a choice merges with the end of the context (``"is "`` +
``"Paris"`` -> ``" Paris"``), its scored tokens start where ``context + choice`` first differs from the
context's tokens. One request carries every ``context + choice_i`` with ``logprob_start_len`` = the
smallest such boundary and ``max_new_tokens`` 0, so the shared context is prefilled once (the radix
cache shares it) and a choice that is a prefix of another is scored on its own tokens.

Methods (SGLang's definitions):
- ``token_length_normalized`` (default): the mean logprob of the choice's tokens;
- ``greedy_token_selection``: compare token by token, keep the best; a shorter choice is padded with its
  own mean logprob;
- ``unconditional_likelihood_normalized``: the mean of (conditional - unconditional) token logprobs,
  the unconditional ones from the choice tokens alone (the first one, which has none, counts as 0).

Meta info: ``scores`` (what the method ranked by, one per choice), ``normalized_prompt_logprobs``,
``sum_logprobs`` (nats), ``input_token_logprobs`` ([logprob, token id, text] per choice token), ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: Optional[dict[str, Any]] = None


def _argmax_first(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class ChoicesSamplingMethod:
    """Decides among choices given their token logprobs."""

    requires_unconditional_logprobs: bool = False
    name: str = "base"

    def scores(self, normalized: list[float], input_lps: list[list], uncond_lps: Optional[list[list]]) -> list[float]:
        return normalized

    def decide(self, scores: list[float], input_lps: list[list]) -> int:
        return _argmax_first(scores)

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list],
        output_token_logprobs: list[list],
        unconditional_token_logprobs: Optional[list[list]] = None,
    ) -> ChoicesDecision:
        scores = self.scores(normalized_prompt_logprobs, input_token_logprobs, unconditional_token_logprobs)
        best = self.decide(scores, input_token_logprobs)
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "scores": scores,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "choices_method": self.name,
        }
        if unconditional_token_logprobs is not None:
            meta["unconditional_token_logprobs"] = unconditional_token_logprobs
        return ChoicesDecision(choices[best], meta)


class TokenLengthNormalized(ChoicesSamplingMethod):
    name = "token_length_normalized"


class GreedyTokenSelection(ChoicesSamplingMethod):
    name = "greedy_token_selection"

    @staticmethod
    def matrix(input_lps: list[list]) -> list[list[float]]:
        width = max(len(o) for o in input_lps)
        rows = []
        for o in input_lps:
            vals = [t[0] for t in o]
            rows.append(vals + [_mean(vals)] * (width - len(vals)))
        return rows

    def decide(self, scores: list[float], input_lps: list[list]) -> int:
        m = self.matrix(input_lps)
        remaining = list(range(len(m)))
        for j in range(len(m[0])):
            best = max(m[i][j] for i in remaining)
            remaining = [i for i in remaining if m[i][j] == best]
            if len(remaining) == 1:
                break
        return remaining[0]


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    name = "unconditional_likelihood_normalized"
    requires_unconditional_logprobs = True

    def scores(self, normalized: list[float], input_lps: list[list], uncond_lps: Optional[list[list]]) -> list[float]:
        if uncond_lps is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional token logprobs")
        out = []
        for cond, unc in zip(input_lps, uncond_lps):
            if len(cond) != len(unc):
                raise ValueError("input and unconditional token logprobs must have the same length")
            u = [t[0] if t is not None and t[0] is not None else 0.0 for t in unc]
            out.append(_mean([c[0] - v for c, v in zip(cond, u)]))
        return out


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
METHODS = {m.name: m for m in (token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)}


def resolve_method(method: Any) -> ChoicesSamplingMethod:
    """A method object, or its name. Raises ValueError for anything else."""
    if isinstance(method, ChoicesSamplingMethod):
        return method
    if isinstance(method, str) and method in METHODS:
        return METHODS[method]
    raise ValueError(f"choices_method must be one of {sorted(METHODS)}, got {method!r}")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_choices(choices: Any) -> list[str]:
    """Raises ValueError unless ``choices`` is a non-empty list of distinct non-empty strings."""
    if not isinstance(choices, (list, tuple)) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"choices must be a non-empty list of non-empty strings, got {choices!r}")
    if len(set(choices)) != len(choices):
        raise ValueError(f"choices must differ, got {choices!r}")
    return list(choices)


def select_by_logprobs(backend: Any, context: str, choices: list[str], method: Any) -> ChoicesDecision:
    """Score ``choices`` as continuations of ``context`` on ``backend``; see the module docstring.

    Raises:
        ValueError: empty context or bad choices; backend errors pass through.
    """
    choices, method = check_choices(choices), resolve_method(method)
    if not context:
        raise ValueError("select needs some text before it to condition on (the state is empty)")
    t0 = time.perf_counter()
    ctx_ids = backend.tokenize(context)
    if ctx_ids is not None:
        fulls = [backend.tokenize(context + c) for c in choices]
        starts = [min(_common_prefix(ctx_ids, f), len(f) - 1) for f in fulls]
        if min(starts) < 1:
            raise ValueError("select: a choice merges with the first token of the context; add text before it")
        start = min(starts)
        outs = backend.prefill(
            {"input_ids": fulls, "return_logprob": True, "logprob_start_len": start, "return_text_in_logprobs": True}
        )
    else:  # no client tokenizer: the context's token count comes from a prefill of the context alone
        start = backend.cache_prefix(context)["prompt_tokens"]
        starts = [start] * len(choices)
        outs = backend.prefill(
            {
                "text": [context + c for c in choices],
                "return_logprob": True,
                "logprob_start_len": start,
                "return_text_in_logprobs": True,
            }
        )
    input_lps = [list(o["meta_info"]["input_token_logprobs"][s - start :]) for o, s in zip(outs, starts)]
    normalized = [_mean([t[0] for t in lps]) for lps in input_lps]
    uncond = None
    if method.requires_unconditional_logprobs:
        uouts = backend.prefill(
            {"input_ids": [[t[1] for t in lps] for lps in input_lps], "return_logprob": True, "logprob_start_len": 0}
        )
        uncond = [list(o["meta_info"]["input_token_logprobs"]) for o in uouts]
    d = method(
        choices=choices,
        normalized_prompt_logprobs=normalized,
        input_token_logprobs=input_lps,
        output_token_logprobs=[[] for _ in choices],
        unconditional_token_logprobs=uncond,
    )
    assert d.meta_info is not None
    d.meta_info.update(
        {
            "choices": choices,
            "sum_logprobs": [sum(t[0] for t in lps) for lps in input_lps],
            "choice_token_ids": [[t[1] for t in lps] for lps in input_lps],
            "logprob_start_len": start,
            "prompt_tokens": [o["meta_info"]["prompt_tokens"] for o in outs],
            "cached_tokens": [o["meta_info"]["cached_tokens"] for o in outs],
            "e2e_latency": time.perf_counter() - t0,
            "finish_reason": {"type": "select", "decision": d.decision},
        }
    )
    return d
