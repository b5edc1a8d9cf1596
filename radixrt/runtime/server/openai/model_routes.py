"""OpenAI's ``GET /v1/models`` and ``GET /v1/models/{id}``: the one model this server serves."""

from __future__ import annotations

from fastapi import APIRouter, Request

from radixrt.runtime.server.api_models import ModelCard, ModelList, doc
from radixrt.runtime.server.context import START_TIME, ServerContext, ctx, model_info
from radixrt.runtime.server.http.responses import JSONResp

router = APIRouter()


def model_card(c: ServerContext) -> dict:
    r = c.tm.ready_info
    return {
        "id": c.tm.model_name,
        "object": "model",
        "created": START_TIME,
        "owned_by": "radixrt",
        "root": model_info(c.args)["model_path"],
        "max_model_len": r.context_length if r else None,
    }


@router.get("/v1/models", **doc(ModelList, errors=()))
async def models(request: Request):
    return JSONResp({"object": "list", "data": [model_card(ctx(request))]})


@router.get("/v1/models/{model_id:path}", **doc(ModelCard, errors=(404,)))
async def retrieve_model(request: Request, model_id: str):
    c = ctx(request)
    if model_id != c.tm.model_name:
        return JSONResp(
            {
                "error": {
                    "message": f"model {model_id!r} not found; this server serves {c.tm.model_name!r}",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            status_code=404,
        )
    return JSONResp(model_card(c))
