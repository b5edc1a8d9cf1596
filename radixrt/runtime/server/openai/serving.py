"""What chat and completions share: the model check, submitting requests (validation errors named by
OpenAI's fields), and ONE response path, streamed (SSE chunks, a usage chunk, ``[DONE]``) or not (499 when
the client goes away first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from fastapi import Request
from starlette.responses import Response

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.tokenizer.generate_input import GenerateInput
from radixrt.runtime.server.context import ServerContext
from radixrt.runtime.server.openai.protocol import ApiError, batch_usage
from radixrt.runtime.server.openai.sampling import openai_param
from radixrt.runtime.server.manager.req_batch import ReqBatch
from radixrt.runtime.server.http.responses import (
    SSE_DONE,
    ClientGone,
    JSONResp,
    SSEResponse,
    first_or_abort,
    sse,
    wait_or_abort,
)


def check_model(c: ServerContext, model: Optional[str]) -> None:
    """Raises ApiError 400 ``model_not_found`` unless ``model`` is None or a name this server answers to."""
    ok = {c.tm.model_name, c.args.model, c.args.served_model_name} - {None}
    if model is not None and model not in ok:
        raise ApiError(
            f"model {model!r} is not served here; available: [{c.tm.model_name!r}]",
            param="model",
            code="model_not_found",
        )


def session_of(request: Request, body_session_id: Optional[str]) -> Optional[str]:
    """The session of an OpenAI call: the ``X-Session-Id`` header or the body's ``session_id`` (extra_body).

    Raises:
        ApiError: 400 when both are given and differ.
    """
    header = request.headers.get("x-session-id")
    if header is not None and body_session_id is not None and header != body_session_id:
        raise ApiError("the X-Session-Id header and session_id differ", param="session_id")
    return header if header is not None else body_session_id


async def submit(
    c: ServerContext,
    prompt_param: str,
    max_param: str,
    sps: list[dict],
    texts=None,
    ids=None,
    return_logprob=False,
    top_n=0,
    cache_salt=None,
    grammar_param=None,
    session_id=None,
) -> ReqBatch:
    """Validate and queue one request per entry of ``sps`` (prompt ``texts[i]`` or ``ids[i]``).

    Raises:
        ApiError: 400 whose ``param`` is the OpenAI field (``prompt_param`` for the prompt, ``max_param``
            for the length; ``grammar_param``, the grammar's source field, when it is bad), 503 when not ready.
    """
    try:
        reqs, _ = await c.tm.build(
            GenerateInput(
                prompt=texts,
                input_ids=ids,
                sampling_params=sps,
                return_logprob=return_logprob,
                logprob_start_len=-1,
                top_logprobs_num=top_n,
                stream=False,
                cache_salt=cache_salt,
                session_id=session_id,
            )
        )
        return await c.tm.submit(reqs, rename=lambda p: openai_param(p, prompt_param, max_param, grammar_param))
    except ValueError as e:
        native, msg = e.param if isinstance(e, ValidationError) else None, str(e)
        param = openai_param(native, prompt_param, max_param, grammar_param)
        if native and param != native and msg.startswith(native):  # "text must ...", "choices[0]: ..."
            msg = param + msg[len(native) :]
        msg = msg.replace("max_new_tokens", max_param).replace("min_new_tokens", "min_tokens")
        raise ApiError(msg, param=param) from None


@dataclass
class Envelope:
    """The fields every object of one OpenAI call carries. ``object`` is the non-streamed object's type;
    chunks are ``object + ".chunk"`` for chat and the same ``text_completion`` for completions."""

    id: str
    object: str
    chunk_object: str
    created: int
    model: str
    include_usage: bool = False

    def chunk(self, choices: list, usage: Optional[dict] = None) -> dict:
        d = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            d["usage"] = usage
        return d


async def stream(
    request: Request,
    env: Envelope,
    batch: ReqBatch,
    n: int,
    head: list[dict],
    step: Callable[[int, object], Iterable[dict]],
) -> Response:
    """The SSE answer: one chunk per choice of ``head``, then per output of request i one chunk per choice
    that ``step(i, StrOut)`` returns, then the usage chunk (``stream_options.include_usage``) and
    ``[DONE]``. The status line waits for the first output, so a request refused before its first token
    is a 400 (:func:`first_or_abort`); an error later (the runtime died) is sent as an error event before
    ``[DONE]``; a client that goes away aborts the unfinished requests (499 if before the first output)."""
    try:
        await first_or_abort(request, batch)
    except ClientGone:
        return Response(status_code=499)

    async def events():
        try:
            for c in head:
                yield sse(env.chunk([c]))
            while not batch.finished:
                i, s = await batch.next()
                for c in step(i, s):
                    yield sse(env.chunk([c]))
            if env.include_usage:
                yield sse(env.chunk([], batch_usage(batch.outs, n)))
        except ApiError as e:
            yield sse(e.body())
        yield SSE_DONE

    return SSEResponse(events(), batch.abort_unfinished)


async def complete(
    request: Request, env: Envelope, batch: ReqBatch, n: int, choice: Callable[[int, object], dict]
) -> Response:
    """The non-streamed answer: ``choice(i, ReqOutput)`` per request, and usage; 499 if the client left."""
    try:
        outs = await wait_or_abort(request, batch)
    except ClientGone:
        return Response(status_code=499)
    return JSONResp(
        {
            "id": env.id,
            "object": env.object,
            "created": env.created,
            "model": env.model,
            "system_fingerprint": None,
            "choices": [choice(i, o) for i, o in enumerate(outs)],
            "usage": batch_usage(outs, n),
        }
    )
