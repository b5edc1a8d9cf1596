"""From user input to validated :class:`GenerateReq` s, and from :class:`StrOut` s to response dicts.

Shared by the in-process Engine and the server's TokenizerManager, so both accept and reject exactly
the same requests (:class:`ValidationError`, a ValueError whose ``param`` names the field).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import FinishReason, GenerateReq, SamplingParams, StrOut, room
from radixrt.runtime.tokenizer.generate_input import GenerateInput
from radixrt.runtime.tokenizer.session_args import check_session_params
from radixrt.runtime.sampling.params import grammar_of, normalize

MAX_TOP_LOGPROBS = 20


@dataclass
class Limits:
    """What validation needs to know of the model: sizes in tokens."""

    context_length: int
    vocab_size: int
    max_total_tokens: int
    max_token_chars: int = 0  # the longest token's text (0: unknown); longer texts are refused untokenized

    @property
    def max_chars(self) -> Optional[int]:
        """Characters beyond which a prompt cannot fit the context whatever its tokens (None: unknown)."""
        return self.context_length * self.max_token_chars if self.max_token_chars else None


def max_token_chars(tokenizer) -> int:
    """Characters in the vocabulary's longest token: a text longer than ``context_length`` times this cannot
    fit, so it is refused before tokenizing (such a prompt would hold the server's event loop for seconds)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=0)


MAX_BATCH = 1024  # prompts in one call (OpenAI's n is capped at 128); 100k one-token prompts stalled a server


def _as_batch(x: Any, name: str) -> tuple[list, bool]:
    """(items, was_single). Raises ValidationError above :data:`MAX_BATCH` items."""
    items, single = _batch_items(x, name)
    if len(items) > MAX_BATCH:
        raise ValidationError(f"{name}: at most {MAX_BATCH} prompts in one call, got {len(items)}", name)
    return items, single


def _batch_items(x: Any, name: str) -> tuple[list, bool]:
    if name == "input_ids":
        if isinstance(x, list) and x and all(isinstance(i, list) for i in x):
            return x, False
        return [x], True
    if isinstance(x, list):
        return x, False
    return [x], True


def build_requests(
    tokenizer,
    limits: Limits,
    inp: GenerateInput,
    grammar_check=None,
) -> tuple[list[GenerateReq], bool]:
    """Validate and tokenize ``inp``. Returns ``(requests, single)``; ``single`` means one item was given.

    Raises:
        ValidationError: no or two inputs, an empty prompt, a prompt or prompt + max_new_tokens beyond the
            context (the message gives the counts), token ids out of the vocabulary, bad sampling
            parameters, or a grammar spec that does not compile (``grammar_check(kind, spec)``).
    """
    if (inp.prompt is None) == (inp.input_ids is None):
        raise ValidationError("exactly one of text/prompt and input_ids must be given", "text")
    if inp.prompt is not None:
        items, single = _as_batch(inp.prompt, "text")
        for t in items:
            if not isinstance(t, str):
                raise ValidationError(f"text must be a string or a list of strings, got {type(t).__name__}", "text")
            if t == "":
                raise ValidationError("text must not be empty", "text")
            if limits.max_chars is not None and len(t) > limits.max_chars:
                raise ValidationError(
                    f"the prompt has {len(t)} characters, more than the context length of "
                    f"{limits.context_length} tokens can hold",
                    "text",
                )
        id_lists = [tokenizer.encode(t, add_special_tokens=False) for t in items]
    else:
        id_lists, single = _as_batch(inp.input_ids, "input_ids")
        for ids in id_lists:
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValidationError("input_ids must be a list of integers or a list of such lists", "input_ids")
            if not ids:
                raise ValidationError("input_ids must not be empty", "input_ids")
            bad = [i for i in ids if not 0 <= i < limits.vocab_size]
            if bad:
                raise ValidationError(
                    f"input_ids: token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})", "input_ids"
                )
    n = len(id_lists)
    sps = inp.sampling_params if isinstance(inp.sampling_params, list) else [inp.sampling_params] * n
    if len(sps) != n:
        raise ValidationError(f"sampling_params has {len(sps)} entries for {n} prompts", "sampling_params")
    if isinstance(inp.rid, list) and len(inp.rid) != n:
        raise ValidationError(f"rid: {len(inp.rid)} ids for {n} prompts", "rid")
    rids = inp.rid if isinstance(inp.rid, list) else [inp.rid] * n
    if not isinstance(inp.return_logprob, bool):
        raise ValidationError(f"return_logprob must be a boolean, got {inp.return_logprob!r}", "return_logprob")
    if (
        not isinstance(inp.top_logprobs_num, int)
        or isinstance(inp.top_logprobs_num, bool)
        or not 0 <= inp.top_logprobs_num <= MAX_TOP_LOGPROBS
    ):
        raise ValidationError(
            f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {inp.top_logprobs_num!r}",
            "top_logprobs_num",
        )
    if inp.cache_salt is not None and not isinstance(inp.cache_salt, str):
        raise ValidationError("cache_salt must be a string", "cache_salt")
    sess = check_session_params(inp.session_params, inp.session_id)
    reqs = []
    for ids, sp_in, r in zip(id_lists, sps, rids):
        sp = normalize(sp_in)
        _check_length(len(ids), sp, limits, "text" if inp.prompt is not None else "input_ids")
        bad = [t for t in sp.stop_token_ids if t >= limits.vocab_size]
        if bad:
            raise ValidationError(
                f"stop_token_ids: token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})",
                "stop_token_ids",
            )
        g = grammar_of(sp)
        if g is not None and grammar_check is not None:
            spec = grammar_check(g[0], g[1], sp.any_whitespace)
            if isinstance(spec, str):  # the normalized text: the scheduler's compile-cache key is the same
                setattr(sp, g[0], spec)
        start = -1
        if inp.return_logprob:
            start = len(ids) - 1 if inp.logprob_start_len is None else inp.logprob_start_len
            if start == -1:
                start = -1
            elif not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= len(ids):
                raise ValidationError(
                    f"logprob_start_len must be in [0, {len(ids)}] (the prompt length) or -1, got {start!r}",
                    "logprob_start_len",
                )
        bad = [t for t in sp.logit_bias if t >= limits.vocab_size]
        if bad:
            raise ValidationError(
                f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})", "logit_bias"
            )
        if sp.n > 1 and (sess is not None or inp.session_id is not None):
            raise ValidationError("n: a session continues one conversation; n > 1 is not allowed with a session", "n")
        if len(id_lists) > 1 and (sess is not None or inp.session_id is not None):
            field = "text" if inp.prompt is not None else "input_ids"
            raise ValidationError(f"{field}: a session continues one conversation; one prompt per call", field)
        # n samples: n requests of the same prompt (the scheduler shares its KV); seeds seed + i
        for k in range(sp.n):
            spk = sp if sp.n == 1 else msgspec.structs.replace(sp, n=1, seed=None if sp.seed is None else sp.seed + k)
            rk = r if sp.n == 1 or not r else f"{r}-{k}"
            reqs.append(
                GenerateReq(
                    rid=rk or uuid.uuid4().hex,
                    input_ids=list(ids),
                    sampling_params=spk,
                    return_logprob=inp.return_logprob,
                    logprob_start_len=start,
                    top_logprobs_num=inp.top_logprobs_num if inp.return_logprob else 0,
                    stream=inp.stream,
                    cache_salt=inp.cache_salt,
                    session_params=sess,
                    session_id=inp.session_id,
                )
            )
    # SGLang answers a list as soon as one prompt asks for n > 1 samples
    return reqs, single and len(reqs) == 1


class GrammarCheck:
    """The ``grammar_check`` hook of :func:`build_requests`, shared by the Engine and the server.

    A call checks a spec (:func:`radixrt.runtime.constrained.validate_spec`), starts compiling it in the
    compiled-grammar cache's threads and returns the normalized spec text (the cache key, so the scheduler
    finds the same compiled grammar). :meth:`wait` / :meth:`wait_async` then wait for every compile.
    Errors are :class:`ValidationError` whose ``param`` is the grammar kind (``json_schema``, ``regex``,
    ``ebnf``, ``structural_tag``): a bad spec, a spec that does not compile, or ``grammar_backend='none'``.
    """

    def __init__(self, grammar_cache):
        self.cache = grammar_cache
        self.pending: list = []  # (kind, concurrent.futures.Future of the compiled grammar)

    def __call__(self, kind: str, spec: Any, any_whitespace: bool = False) -> str:
        from radixrt.runtime.constrained import validate_spec

        if self.cache is None:
            raise ValidationError(f"{kind}: grammar-constrained decoding is off (grammar_backend='none')", kind)
        try:
            spec = validate_spec(kind, spec)
        except ValueError as e:
            raise ValidationError(str(e), kind) from None
        self.pending.append((kind, self.cache.submit(kind, spec, any_whitespace)))
        return spec

    def wait(self) -> None:
        """Block until every compile is done. Raises ValidationError on one that failed."""
        for kind, fut in self.pending:
            _compiled(kind, fut.exception())

    async def wait_async(self) -> None:
        """:meth:`wait` for an event loop (the compiles run in the cache's threads)."""
        for kind, fut in self.pending:
            try:
                await asyncio.wrap_future(fut)
            except ValueError as e:
                _compiled(kind, e)


def _compiled(kind: str, error: Optional[BaseException]) -> None:
    if isinstance(error, ValueError):
        raise ValidationError(str(error), kind) from None
    if error is not None:
        raise error


def _check_length(n: int, sp: SamplingParams, lim: Limits, field: str) -> None:
    if n >= lim.context_length:
        raise ValidationError(
            f"the prompt has {n} tokens, but the context length is {lim.context_length} "
            f"tokens: at most {lim.context_length - 1} prompt tokens fit",
            field,
        )
    if sp.max_new_tokens is not None and n + sp.max_new_tokens > lim.context_length:
        raise ValidationError(
            f"max_new_tokens: the prompt has {n} tokens and {sp.max_new_tokens} new tokens "
            f"were asked for, {n + sp.max_new_tokens} in all, above the context length of "
            f"{lim.context_length} tokens",
            "max_new_tokens",
        )
    # omitted: up to the room left in the context or the pool, whichever is smaller (SGLang's max_req_len)
    total = n + (
        sp.max_new_tokens
        if sp.max_new_tokens is not None
        else max(1, room(n, lim.context_length, lim.max_total_tokens))
    )
    if total > lim.max_total_tokens:  # the prompt alone too big: the prompt's field is the one to change
        raise ValidationError(
            f"the request needs up to {total} tokens of KV, above the pool size of "
            f"{lim.max_total_tokens} tokens (max_total_tokens)",
            field if n >= lim.max_total_tokens else "max_new_tokens",
        )


@dataclass
class ReqOutput:
    """Accumulates a request's StrOuts into SGLang's response dict."""

    rid: str
    tokenizer: Any
    return_text_in_logprobs: bool = False
    created: float = field(default_factory=time.perf_counter)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished_reason: Optional[FinishReason] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    input_token_logprobs: Optional[list] = None
    input_top_logprobs: Optional[list] = None
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None

    def add(self, s: StrOut, now: Optional[float] = None) -> None:
        """Fold in one delta; ``now`` is when it arrived (perf_counter seconds), default: now."""
        now = time.perf_counter() if now is None else now
        o = s.token
        self.text += s.text_delta
        self.output_ids.extend(o.new_token_ids)
        if o.new_token_ids and self.first_token_time is None:
            self.first_token_time = now
        self.finished_reason = o.finished_reason
        if self.finished_reason is not None:
            self.finish_time = now
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = (
            o.prompt_tokens,
            o.completion_tokens,
            o.cached_tokens,
        )
        self.output_token_logprobs.extend(o.output_token_logprobs)
        self.output_top_logprobs.extend(o.output_top_logprobs)
        if o.input_token_logprobs is not None:
            self.input_token_logprobs = o.input_token_logprobs
            self.input_top_logprobs = o.input_top_logprobs

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def _lp(self, pairs: list) -> list:
        out = []
        for p in pairs:
            if p is None:
                out.append(None)
                continue
            lp, tid = p
            text = self.tokenizer.decode([tid]) if self.return_text_in_logprobs else None
            out.append([lp, tid, text])
        return out

    def to_dict(self, return_logprob: bool) -> dict:
        meta = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": None if self.finished_reason is None else self.finished_reason.as_dict(),
            "e2e_latency": (self.finish_time or time.perf_counter()) - self.created,
            "ttft": (self.first_token_time - self.created) if self.first_token_time else None,
        }
        if return_logprob:
            meta["output_token_logprobs"] = self._lp(self.output_token_logprobs)
            meta["output_top_logprobs"] = [self._lp(t) for t in self.output_top_logprobs]
            meta["input_token_logprobs"] = self._lp(self.input_token_logprobs or [])
            meta["input_top_logprobs"] = [self._lp(t) if t else None for t in (self.input_top_logprobs or [])]
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}
