"""``POST /v1/completions``: OpenAI (legacy) completions over raw prompts."""

from __future__ import annotations

from fastapi import APIRouter, Request

from radixrt.runtime.server.api_models import CompletionResponse, doc
from radixrt.runtime.server.context import ctx
from radixrt.runtime.server.openai.protocol import (
    MAX_COMPLETION_LOGPROBS,
    ApiError,
    CompletionRequest,
    parse_body,
    completion_logprobs,
    finish_reason,
    new_id,
    now,
)
from radixrt.runtime.server.openai.sampling import n_seeds, sampling_params
from radixrt.runtime.server.openai.serving import Envelope, check_model, complete, session_of, stream, submit

router = APIRouter()


def _check(req: CompletionRequest) -> None:
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise ApiError(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {req.logprobs}", param="logprobs")
    if req.suffix is not None:
        raise ApiError("suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise ApiError("best_of is not supported (only best_of == n)", param="best_of")
    if req.echo and req.logprobs is not None:
        raise ApiError("echo with logprobs is not supported", param="echo")


def _prompts(p) -> tuple[list | None, list | None]:
    """``(texts, ids)``: the prompt as a list of strings or a list of token-id lists (one is None)."""
    if isinstance(p, str):
        return [p], None
    if not p:
        raise ApiError("prompt must not be empty", param="prompt")
    if isinstance(p[0], str):
        return list(p), None
    if isinstance(p[0], int):
        return None, [list(p)]
    return None, [list(x) for x in p]


@router.post("/v1/completions", **doc(CompletionResponse, CompletionRequest, stream=True))
async def completions(request: Request):
    """OpenAI completions: ``prompt`` is a string, a list of strings, token ids or a list of token-id lists.

    ``max_tokens`` omitted: up to the room left in the context (min(context length, KV pool) - prompt tokens), not
    OpenAI's 16. ``logprobs`` is an int in [0, 5]. Choice ``index`` is ``prompt_index * n + i``.
    """
    c = ctx(request)
    tm = c.tm
    req = await parse_body(request, CompletionRequest)
    tm.check_ready()
    check_model(c, req.model)
    _check(req)
    sp, grammar_src = sampling_params(req, req.max_tokens, "max_tokens")
    texts, ids = _prompts(req.prompt)
    n = req.n
    prompts = texts if texts is not None else ids
    seeds = n_seeds(req.seed, n)
    sps = [dict(sp, **({"seed": s} if s is not None else {})) for _ in prompts for s in seeds]
    rep = lambda xs: [x for x in xs for _ in range(n)]
    return_lp = req.logprobs is not None
    top_n = req.logprobs or 0
    batch = await submit(
        c,
        "prompt",
        "max_tokens",
        sps,
        texts=rep(texts) if texts is not None else None,
        ids=rep(ids) if ids is not None else None,
        return_logprob=return_lp,
        top_n=top_n,
        cache_salt=req.cache_salt,
        grammar_param=grammar_src,
        session_id=session_of(request, req.session_id),
    )
    env = Envelope(
        new_id("cmpl"),
        "text_completion",
        "text_completion",
        now(),
        tm.model_name,
        bool(req.stream_options and req.stream_options.include_usage),
    )
    echo = [x if texts is not None else tm.tokenizer.decode(x) for x in prompts] if req.echo else None

    def lp_obj(pairs, tops, offset):
        return completion_logprobs(c.token_texts(), pairs, tops, top_n, offset) if return_lp else None

    def text_choice(i, text, finish=None, logprobs=None) -> dict:
        return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}

    if req.stream:
        offsets = [0] * len(batch.outs)  # text offset of each choice's next token (streamed logprobs)

        def step(i, s):
            t = s.token
            lp = lp_obj(t.output_token_logprobs, t.output_top_logprobs, offsets[i]) if t.output_token_logprobs else None
            if lp is not None and lp["tokens"]:
                offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            out = [text_choice(i, s.text_delta, logprobs=lp)] if s.text_delta or lp else []
            if t.finished_reason is not None:
                out.append(text_choice(i, "", finish_reason(t.finished_reason)))
            return out

        head = [text_choice(i, echo[i // n]) for i in range(len(batch.outs))] if echo is not None else []
        return await stream(request, env, batch, n, head, step)

    def choice(k, o) -> dict:
        prefix = echo[k // n] if echo is not None else ""
        return text_choice(
            k,
            prefix + o.text,
            finish_reason(o.finished_reason),
            lp_obj(o.output_token_logprobs, o.output_top_logprobs, 0),
        )

    return await complete(request, env, batch, n, choice)
