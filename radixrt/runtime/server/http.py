"""The FastAPI app: OpenAI-compatible routes and SGLang's native routes.

OpenAI: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``.
Native: ``POST /generate``, ``GET /get_model_info``, ``GET /get_server_info``, ``POST /flush_cache``,
``POST /abort_request``, ``GET /health``, ``GET /health_generate``, ``GET /metrics`` (``--enable-metrics``).

Every invalid request is a 400 ``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``
(FastAPI's own validation errors included); a dead or loading runtime is a 503 with a message; a missing or
wrong API key (``--api-key``) is a 401 on every route but ``/health``.

Default ``max_tokens`` on the OpenAI routes: when neither ``max_tokens`` nor ``max_completion_tokens`` is
given, generation may run up to the room left in the context (context length - prompt tokens); a prompt
that leaves no room (``>= context length``) is a 400 giving the counts.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
from typing import Any, Optional

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse

from radixrt.runtime.server.openai_protocol import (CHAT_ROLES, MAX_CHAT_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS,
                                                    ApiError, ChatCompletionRequest, CompletionRequest, TokenTexts,
                                                    batch_usage, chat_logprobs, completion_logprobs, error_body,
                                                    finish_reason, n_seeds, new_id, now, openai_param,
                                                    sampling_params)
from radixrt.runtime.server.tokenizer_manager import ReqBatch, TokenizerManager, native_param
from radixrt.runtime.server.tool_parser import ToolPlan, parse_output, plan_tools, render_tool_history

logger = logging.getLogger("radixrt.server")


# ---- responses -------------------------------------------------------------------------------------------
class JSONResp(Response):
    """JSON via msgspec (NaN/inf become null instead of failing the response)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """An event stream that aborts its requests however it ends (client gone, cancelled, finished)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def api_error_response(e: ApiError) -> JSONResp:
    return JSONResp(e.body(), status_code=e.status)


class AuthMiddleware:
    """``Authorization: Bearer KEY`` on every route but /health (pure ASGI: streaming is untouched)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            got = b""
            for k, v in scope.get("headers", []):
                if k == b"authorization":
                    got = v
                    break
            if not hmac.compare_digest(got, self.expected):
                msg = ("Incorrect API key provided." if got else
                       "Missing API key: send the header 'Authorization: Bearer <key>'.")
                resp = JSONResp(error_body(msg, None, "invalid_request_error", "invalid_api_key"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---- helpers -----------------------------------------------------------------------------------------------
def _loc_param(loc) -> Optional[str]:
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            # pydantic reports a failed union member by its type ("str", "list[int]"): not a field name
            if out and (p in ("str", "int", "float", "bool") or "[" in str(p) or "function" in str(p)):
                continue
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(errs: list) -> ApiError:
    """A pydantic / FastAPI validation error list as a 400 naming the first bad field."""
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    param = _loc_param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return ApiError(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    return ApiError(f"{param}: {msg}" if param else msg, param=param)


async def _disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    pass


async def wait_or_abort(request: Request, batch: ReqBatch) -> list:
    """Wait for every request of the batch; if the client disconnects first, abort them (pages freed)."""
    waiter = asyncio.ensure_future(batch.wait())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        raise ClientGone()
    finally:
        for t in (waiter, watcher):
            if not t.done():
                t.cancel()
        batch.abort_unfinished()


def check_tools(req: ChatCompletionRequest) -> Optional[ToolPlan]:
    """THE hook for tool calling (see :mod:`.tool_parser`): validates ``tools``/``tool_choice`` and returns
    the plan (prompt, grammar, parsing), or None when no tool may be called. Raises ApiError 400."""
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    if plan is not None:
        for field in ("response_format", "regex", "ebnf"):
            v = getattr(req, field)
            if v is not None and not (field == "response_format" and isinstance(v, dict) and v.get("type") == "text"):
                raise ApiError(f"{field} cannot be combined with tools (tool_choice {plan.mode!r} constrains the "
                               f"output to tool calls); use tool_choice 'none'", param=field)
    return plan


def render_chat(tokenizer, messages, plan: Optional[ToolPlan] = None) -> str:
    """The model's chat template over OpenAI messages (roles system/developer/user/assistant/tool); the
    tools of ``plan`` go into the system prompt, earlier ``tool_calls`` into the assistant text."""
    if not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    msgs = []
    for i, m in enumerate(messages):
        if m.role not in CHAT_ROLES:
            raise ApiError(f"messages[{i}].role: unknown role {m.role!r}; expected one of "
                           f"{list(CHAT_ROLES)}", param=f"messages[{i}].role")
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) "
                                   f"are supported", param=f"messages[{i}].content[{j}]")
                texts.append(part["text"])
            content = "\n".join(texts)
        if content is None:
            if m.role in ("system", "developer", "user"):
                raise ApiError(f"messages[{i}].content is required for role {m.role!r}",
                               param=f"messages[{i}].content")
            content = ""
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
        msgs.append(d)
    msgs = render_tool_history(msgs)
    if plan is not None:
        msgs = plan.inject(msgs)
    try:
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    except Exception as e:
        raise ApiError(f"messages: the chat template failed: {type(e).__name__}: {e}", param="messages") from None


# ---- the app -------------------------------------------------------------------------------------------
def create_app(args, tm: TokenizerManager, metrics=None, lifespan=None) -> FastAPI:
    app = FastAPI(title="radixrt", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    if args.api_key:
        app.add_middleware(AuthMiddleware, api_key=args.api_key)
    token_texts: dict[str, TokenTexts] = {}

    def tt() -> TokenTexts:
        if "t" not in token_texts:
            token_texts["t"] = TokenTexts(tm.tokenizer)
        return token_texts["t"]

    # ---- errors ----
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return api_error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return api_error_response(validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        typ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResp(error_body(str(e.detail), None, typ), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("internal error on %s", request.url.path)
        return JSONResp(error_body(f"internal error: {type(e).__name__}: {e}", None, "internal_error"),
                        status_code=500)

    async def body_json(request: Request) -> Any:
        raw = await request.body()
        try:
            return msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError as e:
            raise ApiError(f"the request body is not valid JSON: {e}") from None

    async def parse(request: Request, model_cls):
        """The JSON body as ``model_cls`` (any content type; pydantic errors -> 400 naming the field)."""
        body = await body_json(request)
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object")
        try:
            return model_cls.model_validate(body)
        except ValidationError as e:
            raise validation_error(e.errors()) from None

    def check_model(model: Optional[str]) -> None:
        ok = {tm.model_name, args.model, args.served_model_name} - {None}
        if model is not None and model not in ok:
            raise ApiError(f"model {model!r} is not served here; available: [{tm.model_name!r}]", param="model",
                           code="model_not_found")

    # ---- health and info ----
    @app.get("/health")
    async def health():
        if tm.dead is not None:
            return JSONResp(error_body(tm.dead, None, "service_unavailable"), status_code=503)
        if tm.ready is None or not tm.ready.is_set():
            return JSONResp(error_body("the model is still loading", None, "service_unavailable"), status_code=503)
        return JSONResp({"status": "ok"})

    @app.get("/health_generate")
    async def health_generate():
        await tm.health_generate()
        return JSONResp({"status": "ok"})

    @app.get("/get_model_info")
    async def get_model_info():
        return JSONResp(model_info(args))

    @app.get("/get_server_info")
    async def get_server_info():
        return JSONResp(await tm.server_info())

    @app.api_route("/flush_cache", methods=["POST", "GET"])
    async def flush_cache():
        return JSONResp(await flush(tm))

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await body_json(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            raise ApiError("rid must be a string", param="rid")
        tm.abort(rid)
        return JSONResp({"success": True})

    if metrics is not None:
        from radixrt.runtime.server.metrics import CONTENT_TYPE

        @app.get("/metrics")
        async def get_metrics():
            if tm.dead is None and tm.ready is not None and tm.ready.is_set():
                metrics.update(await tm.get_info())
            return Response(metrics.render(), media_type=CONTENT_TYPE)

    def model_card() -> dict:
        r = tm.ready_info
        return {"id": tm.model_name, "object": "model", "created": START_TIME, "owned_by": "radixrt",
                "root": model_info(args)["model_path"], "max_model_len": r.context_length if r else None}

    @app.get("/v1/models")
    async def models():
        return JSONResp({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str):
        if model_id != tm.model_name:
            return JSONResp({"error": {"message": f"model {model_id!r} not found; this server serves "
                                       f"{tm.model_name!r}", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}}, status_code=404)
        return JSONResp(model_card())

    # ---- native generate ----
    @app.post("/generate")
    async def generate(request: Request):
        body = await body_json(request)
        call = await tm.native_generate(body)
        if call.stream:
            async def events():
                try:
                    async for d in call.chunks():
                        yield sse(d)
                except ApiError as e:
                    yield sse(e.body())
                yield SSE_DONE
            return SSEResponse(events(), call.batch.abort_unfinished)
        try:
            await wait_or_abort(request, call.batch)
        except ClientGone:
            return Response(status_code=499)
        return JSONResp(await call.result())

    # ---- OpenAI ----
    async def submit(prompt_param: str, max_param: str, sps: list[dict], texts=None, ids=None,
                     return_logprob=False, top_n=0, cache_salt=None, grammar_param=None) -> ReqBatch:
        try:
            reqs, _ = await tm.build(prompt=texts, input_ids=ids, sampling_params=sps, return_logprob=return_logprob,
                                     logprob_start_len=-1, top_logprobs_num=top_n, stream=False,
                                     cache_salt=cache_salt)
            return await tm.submit(reqs)
        except ValueError as e:
            msg = str(e)
            param = openai_param(native_param(msg), msg, prompt_param, max_param)
            if grammar_param is not None and param in ("response_format.json_schema.schema", "structural_tag"):
                param = grammar_param  # the tools' grammar failed to compile
            raise ApiError(msg, param=param) from None

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """OpenAI chat completions over the model's chat template.

        ``max_tokens`` / ``max_completion_tokens`` omitted: up to the room left in the context
        (context length - prompt tokens). ``n`` > 1 submits n requests sharing the prompt's KV (seeds
        ``seed + i`` when ``seed`` is given). ``finish_reason`` is ``stop`` (EOS, a stop string or token,
        or an abort), ``length``, or ``tool_calls``: ``tools``/``tool_choice`` are handled by
        :mod:`.tool_parser` (tools injected into the system prompt, output constrained and parsed into
        ``message.tool_calls``; streamed as OpenAI tool-call deltas).
        """
        req = await parse(request, ChatCompletionRequest)
        tm.check_ready()
        check_model(req.model)
        plan = check_tools(req)
        if req.top_logprobs is not None:
            if not 0 <= req.top_logprobs <= MAX_CHAT_TOP_LOGPROBS:
                raise ApiError(f"top_logprobs must be in [0, {MAX_CHAT_TOP_LOGPROBS}], got {req.top_logprobs}",
                               param="top_logprobs")
            if req.top_logprobs > 0 and not req.logprobs:
                raise ApiError("top_logprobs needs logprobs=true", param="top_logprobs")
        max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_new = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        sp = sampling_params(req, max_new, max_param)
        if plan is not None:
            kind, spec = plan.grammar()
            sp[kind] = spec
        prompt = render_chat(tm.tokenizer, req.messages, plan)
        ids = tm.tokenizer.encode(prompt, add_special_tokens=False)
        n = req.n
        sps = [dict(sp, **({"seed": s} if s is not None else {})) for s in n_seeds(req.seed, n)]
        top_n = req.top_logprobs or 0
        batch = await submit("messages", max_param, sps, ids=[ids] * n, return_logprob=req.logprobs,
                             top_n=top_n, cache_salt=req.cache_salt, grammar_param="tools" if plan else None)
        cid, created, model = new_id("chatcmpl"), now(), tm.model_name
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def lp_obj(pairs, tops):
            return {"content": chat_logprobs(tt(), pairs, tops, top_n)} if req.logprobs else None

        if req.stream:
            def chunk(i, delta, finish=None, logprobs=None):
                d = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "system_fingerprint": None,
                     "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
                if include_usage:
                    d["usage"] = None
                return d

            parsers = [plan.stream() for _ in range(n)] if plan is not None else None

            async def events():
                try:
                    for i in range(n):
                        yield sse(chunk(i, {"role": "assistant", "content": ""}))
                    while not batch.finished:
                        i, s = await batch.next()
                        t = s.token
                        lp = lp_obj(t.output_token_logprobs, t.output_top_logprobs) if t.output_token_logprobs else None
                        if parsers is not None:  # tool calls: content and tool_call deltas from the parser
                            deltas = parsers[i].feed(s.text_delta or "")
                            if t.finished_reason is not None:
                                deltas += parsers[i].finish()
                            if lp and not deltas:
                                deltas = [{"content": ""}]
                            for k, delta in enumerate(deltas):
                                yield sse(chunk(i, delta, logprobs=lp if k == 0 else None))
                            if t.finished_reason is not None:
                                yield sse(chunk(i, {}, parsers[i].finish_reason(finish_reason(t.finished_reason))))
                            continue
                        if s.text_delta or lp:
                            yield sse(chunk(i, {"content": s.text_delta}, logprobs=lp))
                        if t.finished_reason is not None:
                            yield sse(chunk(i, {}, finish_reason(t.finished_reason)))
                    if include_usage:
                        yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "system_fingerprint": None, "choices": [], "usage": batch_usage(batch.outs, n)})
                except ApiError as e:
                    yield sse(e.body())
                yield SSE_DONE
            return SSEResponse(events(), batch.abort_unfinished)

        try:
            outs = await wait_or_abort(request, batch)
        except ClientGone:
            return Response(status_code=499)
        choices = []
        for i, o in enumerate(outs):
            message, reason = {"role": "assistant", "content": o.text}, finish_reason(o.finished_reason)
            if plan is not None:
                message, reason = parse_output(plan, o.text, reason)
            choices.append({"index": i, "message": message,
                            "logprobs": lp_obj(o.output_token_logprobs, o.output_top_logprobs),
                            "finish_reason": reason})
        return JSONResp({"id": cid, "object": "chat.completion", "created": created, "model": model,
                         "system_fingerprint": None, "choices": choices, "usage": batch_usage(outs, n)})

    @app.post("/v1/completions")
    async def completions(request: Request):
        """OpenAI completions: ``prompt`` is a string, a list of strings, token ids or a list of token-id lists.

        ``max_tokens`` omitted: up to the room left in the context (context length - prompt tokens), not
        OpenAI's 16. ``logprobs`` is an int in [0, 5]. Choice ``index`` is ``prompt_index * n + i``.
        """
        req = await parse(request, CompletionRequest)
        tm.check_ready()
        check_model(req.model)
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise ApiError(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {req.logprobs}", param="logprobs")
        if req.suffix is not None:
            raise ApiError("suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise ApiError("best_of is not supported (only best_of == n)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise ApiError("echo with logprobs is not supported", param="echo")
        sp = sampling_params(req, req.max_tokens, "max_tokens")
        p = req.prompt
        if isinstance(p, str):
            texts, ids = [p], None
        elif not p:
            raise ApiError("prompt must not be empty", param="prompt")
        elif isinstance(p[0], str):
            texts, ids = list(p), None
        elif isinstance(p[0], int):
            texts, ids = None, [list(p)]
        else:
            texts, ids = None, [list(x) for x in p]
        n = req.n
        prompts = texts if texts is not None else ids
        seeds = n_seeds(req.seed, n)
        sps = [dict(sp, **({"seed": s} if s is not None else {})) for _ in prompts for s in seeds]
        rep = (lambda xs: [x for x in xs for _ in range(n)])
        return_lp = req.logprobs is not None
        top_n = req.logprobs or 0
        batch = await submit("prompt", "max_tokens", sps, texts=rep(texts) if texts is not None else None,
                             ids=rep(ids) if ids is not None else None, return_logprob=return_lp, top_n=top_n,
                             cache_salt=req.cache_salt)
        cid, created, model = new_id("cmpl"), now(), tm.model_name
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.echo:
            echo = [x if texts is not None else tm.tokenizer.decode(x) for x in prompts]
        else:
            echo = None

        def lp_obj(pairs, tops, offset):
            return completion_logprobs(tt(), pairs, tops, top_n, offset) if return_lp else None

        if req.stream:
            offsets = [0] * len(batch.outs)

            def chunk(i, text, finish=None, logprobs=None):
                d = {"id": cid, "object": "text_completion", "created": created, "model": model,
                     "system_fingerprint": None,
                     "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
                if include_usage:
                    d["usage"] = None
                return d

            async def events():
                try:
                    if echo is not None:
                        for i in range(len(batch.outs)):
                            yield sse(chunk(i, echo[i // n]))
                    while not batch.finished:
                        i, s = await batch.next()
                        t = s.token
                        lp = lp_obj(t.output_token_logprobs, t.output_top_logprobs, offsets[i]) \
                            if t.output_token_logprobs else None
                        if lp is not None:
                            offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1]) if lp["tokens"] else offsets[i]
                        if s.text_delta or lp:
                            yield sse(chunk(i, s.text_delta, logprobs=lp))
                        if t.finished_reason is not None:
                            yield sse(chunk(i, "", finish_reason(t.finished_reason)))
                    if include_usage:
                        yield sse({"id": cid, "object": "text_completion", "created": created, "model": model,
                                   "system_fingerprint": None, "choices": [], "usage": batch_usage(batch.outs, n)})
                except ApiError as e:
                    yield sse(e.body())
                yield SSE_DONE
            return SSEResponse(events(), batch.abort_unfinished)

        try:
            outs = await wait_or_abort(request, batch)
        except ClientGone:
            return Response(status_code=499)
        choices = []
        for k, o in enumerate(outs):
            prefix = echo[k // n] if echo is not None else ""
            choices.append({"index": k, "text": prefix + o.text,
                            "logprobs": lp_obj(o.output_token_logprobs, o.output_top_logprobs, 0),
                            "finish_reason": finish_reason(o.finished_reason)})
        return JSONResp({"id": cid, "object": "text_completion", "created": created, "model": model,
                         "system_fingerprint": None, "choices": choices, "usage": batch_usage(outs, n)})

    return app


START_TIME = now()


def model_info(args) -> dict:
    from radixrt.runtime.model_loader import resolve_model
    src = resolve_model(args.model)
    path = os.path.join(src.directory, src.gguf_file) if src.gguf_file else src.directory
    return {"model_path": path, "tokenizer_path": path, "is_generation": True}


async def flush(tm: TokenizerManager) -> dict:
    """Flush the prefix cache; a 400 while requests are running or waiting."""
    if not await tm.flush_cache():
        raise ApiError("the cache was not flushed: requests are running or waiting; retry when idle")
    return {"success": True, "message": "Cache flushed."}
