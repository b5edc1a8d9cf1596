"""The FastAPI app: OpenAI-compatible routes and SGLang's native routes, assembled from one router per
route family.

OpenAI: ``POST /v1/chat/completions`` (:mod:`.chat`), ``POST /v1/completions`` (:mod:`.completions`),
``GET /v1/models`` (:mod:`.model_routes`). Native (:mod:`.native`): ``POST /generate``, ``GET /get_model_info``,
``GET /get_server_info``, ``POST /flush_cache``, ``POST /abort_request``, ``GET /health``,
``GET /health_generate``, ``GET /metrics`` (``--enable-metrics``). Sessions (:mod:`.session_routes`):
``POST /open_session``, ``POST /close_session``. Live view (:mod:`.dashboard`): ``GET /dashboard`` and the
JSON it reads, ``GET /cache_tree?top=N``.

Every invalid request is a 400 ``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``
(:mod:`.http_errors`; FastAPI's own validation errors included); a dead or loading runtime is a 503 with a
message; a missing or wrong API key (``--api-key``) is a 401 on every route but ``/health``.
``GET /openapi.json`` describes every route's request and response models (:mod:`.api_models`);
``GET /docs`` is its Swagger UI.

Default ``max_tokens`` on the OpenAI routes: when neither ``max_tokens`` nor ``max_completion_tokens`` is given,
generation may run up to the room left in the context (the smaller of the context length and the KV pool, minus the
prompt tokens); a prompt that leaves no room (``>= context length``) is a 400 giving the counts.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from radixrt.runtime.server.native import routes as native, session_routes
from radixrt.runtime.server.observe import dashboard
from radixrt.runtime.server.openai import chat, completions, model_routes
from radixrt.runtime.server.openai.responses import serving as responses
from radixrt.runtime.server.anthropic import serving as messages
from radixrt.runtime.server.api_models import REQUEST_MODELS, add_request_schemas
from radixrt.runtime.server.context import ServerContext
from radixrt.runtime.server.http.body_limit import BodyLimit
from radixrt.runtime.server.http.errors import add_error_handlers
from radixrt.runtime.server.http.errors import error_body, error_response
from radixrt.runtime.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from radixrt.runtime.server.openai.responses.protocol import ResponsesRequest
from radixrt.runtime.server.anthropic.protocol import MessagesRequest


class AuthMiddleware:
    """``Authorization: Bearer KEY`` (or Anthropic's ``x-api-key: KEY``) on every route but /health (pure
    ASGI: streaming is untouched)."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            got, x_key = b"", None
            for k, v in scope.get("headers", []):
                if k == b"authorization":
                    got = v
                elif k == b"x-api-key":
                    x_key = v
            scheme, _, key = got.partition(b" ")  # the scheme is case-insensitive (RFC 9110, 11.1)
            if x_key is not None and not got:
                scheme, key, got = b"bearer", x_key, x_key
            if scheme.lower() != b"bearer" or not hmac.compare_digest(key.strip(), self.expected):
                msg = (
                    "Incorrect API key provided."
                    if got
                    else "Missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
                )
                resp = error_response(
                    scope["path"],
                    error_body(msg, None, "invalid_request_error", "invalid_api_key"),
                    401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(args, tm, metrics=None, lifespan=None) -> FastAPI:
    """The app over a TokenizerManager ``tm`` (``metrics``: a Metrics, or None without /metrics)."""
    import radixrt

    app = FastAPI(
        title="radixrt",
        version=radixrt.__version__,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.ctx = ServerContext(args, tm, metrics)
    if args.api_key:
        app.add_middleware(AuthMiddleware, api_key=args.api_key)
    app.add_middleware(BodyLimit)  # outermost: a 10 MB body is refused before auth or parsing
    add_error_handlers(app)
    app.include_router(native.router)
    app.include_router(session_routes.router)
    app.include_router(dashboard.router)
    if metrics is not None:
        app.include_router(native.metrics_router)
    app.include_router(model_routes.router)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(responses.router)
    app.include_router(messages.router)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            models = (ChatCompletionRequest, CompletionRequest, ResponsesRequest, MessagesRequest) + REQUEST_MODELS
            app.openapi_schema = add_request_schemas(schema, models)
        return app.openapi_schema

    app.openapi = openapi
    return app
