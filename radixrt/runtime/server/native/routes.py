"""SGLang's native routes: ``POST /generate``, ``GET /health``, ``GET /health_generate``,
``GET /get_model_info``, ``GET /get_server_info``, ``POST|GET /flush_cache``, ``POST /abort_request`` and,
with ``--enable-metrics``, ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import Union

from fastapi import APIRouter, Request
from starlette.responses import Response

from radixrt.runtime.server.api_models import (
    AbortRequest,
    GenerateOutput,
    GenerateRequest,
    ModelInfo,
    ServerInfo,
    Status,
    Success,
    doc,
)
from radixrt.runtime.server.context import ctx, model_info
from radixrt.runtime.server.http.errors import ApiError, error_body
from radixrt.runtime.server.http.body import body_json
from radixrt.runtime.server.native.body import native_generate
from radixrt.runtime.server.http.responses import (
    SSE_DONE,
    ClientGone,
    JSONResp,
    SSEResponse,
    first_or_abort,
    sse,
    wait_or_abort,
)

router = APIRouter()
metrics_router = APIRouter()


async def flush(tm) -> dict:
    """Flush the prefix cache; ApiError 400 while requests are running or waiting."""
    if not await tm.flush_cache():
        raise ApiError("the cache was not flushed: requests are running or waiting; retry when idle")
    return {"success": True, "message": "Cache flushed."}


@router.api_route("/health", methods=["GET", "HEAD"], **doc(Status, errors=(503,)))
async def health(request: Request):
    """200 ``{"status": "ok"}`` once the model is loaded; 503 while loading, while a dead child is being
    restarted (or after the restarts ran out) and while draining on SIGTERM. HEAD answers the same status
    (load balancers and ``curl -I`` probe with it)."""
    tm = ctx(request).tm
    reason = tm.dead or tm.admission.draining
    if reason is not None:
        return JSONResp(error_body(reason, None, "service_unavailable"), status_code=503)
    if tm.ready is None or not tm.ready.is_set():
        return JSONResp(error_body("the model is still loading", None, "service_unavailable"), status_code=503)
    return JSONResp({"status": "ok"})


@router.get("/health_generate", **doc(Status, errors=(503,)))
async def health_generate(request: Request):
    """Runs a 1-token generation through every process."""
    await ctx(request).tm.health_generate()
    return JSONResp({"status": "ok"})


@router.get("/get_model_info", **doc(ModelInfo, errors=()))
async def get_model_info(request: Request):
    return JSONResp(model_info(ctx(request).args))


@router.get("/get_server_info", **doc(ServerInfo, errors=(503,)))
async def get_server_info(request: Request):
    return JSONResp(await ctx(request).tm.server_info())


async def flush_cache(request: Request):
    """Free every cached page no request uses; a 400 while requests run."""
    return JSONResp(await flush(ctx(request).tm))


for _method in ("POST", "GET"):
    router.add_api_route(
        "/flush_cache", flush_cache, methods=[_method], operation_id=f"flush_cache_{_method.lower()}", **doc(Success)
    )


@router.post("/abort_request", **doc(Success, AbortRequest, errors=(400,)))
async def abort_request(request: Request):
    """Abort the request ``{"rid": ...}``, or every request in flight with ``{"abort_all": true}`` (SGLang's
    field); their pages are freed. Unknown rids succeed (already finished)."""
    body = await body_json(request)
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    abort_all, rid = body.get("abort_all", False), body.get("rid")
    if not isinstance(abort_all, bool):
        raise ApiError("abort_all must be a boolean", param="abort_all")
    if abort_all:
        if rid is not None:
            raise ApiError("rid and abort_all exclude each other", param="abort_all")
        tm = ctx(request).tm
        for r in list(tm.states):
            tm.abort(r)
        return JSONResp({"success": True})
    if not isinstance(rid, str):
        raise ApiError("rid must be a string (or send abort_all: true)", param="rid")
    ctx(request).tm.abort(rid)
    return JSONResp({"success": True})


@router.post("/generate", **doc(Union[GenerateOutput, list[GenerateOutput]], GenerateRequest, stream=True))
async def generate(request: Request):
    """SGLang's generate (body: see :mod:`.native_body`): one dict for one prompt, a list for a batch, or
    with ``stream`` SSE events of the cumulative dict then ``[DONE]``; 499 if the client leaves first."""
    body = await body_json(request)
    call = await native_generate(ctx(request).tm, body)
    if call.stream:
        try:
            await first_or_abort(request, call.batch)  # a refusal before the first token is a 400
        except ClientGone:
            return Response(status_code=499)

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


@metrics_router.get("/metrics", **doc(text=True, errors=()))
async def get_metrics(request: Request):
    from radixrt.runtime.server.observe.metrics import CONTENT_TYPE

    c = ctx(request)
    tm = c.tm
    if tm.dead is None and tm.ready is not None and tm.ready.is_set():
        c.metrics.update(await tm.get_info())
        c.metrics.update_memory((await tm.server_info())["memory"])
    return Response(c.metrics.render(), media_type=CONTENT_TYPE)
