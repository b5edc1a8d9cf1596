"""The ``--dp`` ingress: an OpenAI-compatible FastAPI app as a Ray Serve deployment.

It tokenizes each request only to get a routing key (the prompt's token ids: the chat template applied to
``messages``, the ``prompt``, or ``input_ids``), hands ``{"tokens", "session", "path", "body"}`` to the
replica deployment's handle, whose :class:`~radixrt.runtime.router.serve_router.PolicyRequestRouter`
picks the replica, and returns the replica's own answer unchanged (the replica is a whole ``radixrt serve``,
so validation, errors and the response bodies are the single-server ones). The replica that answered is
named in the ``X-Radixrt-Replica`` header.

Session key (sticky routing): the ``X-Session-Id`` header, else a ``session_id`` field in the body.
A replica that dies while serving a request ends that request with HTTP 503 and an OpenAI-style error body
naming the failure; the router drops the replica and later requests go to the others.
"""

# No ``from __future__ import annotations``: FastAPI must see ``Request`` itself in the route signatures.
import hmac
import json
import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError

logger = logging.getLogger("radixrt.router")
app = FastAPI(title="radixrt-dp", docs_url=None, redoc_url=None, openapi_url=None)
REPLICA_DIED = (RayActorError, ActorUnavailableError)
STATS_TIMEOUT_S = 30


def error_body(
    message: str, param: Optional[str] = None, typ: str = "invalid_request_error", code: Optional[str] = None
) -> dict:
    """An OpenAI-style error body (the server's shape; the router sits below the server, so its own)."""
    return {"error": {"message": message, "type": typ, "param": param, "code": code}}


def _err(status: int, message: str, param: Optional[str] = None, typ: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(error_body(message, param, typ), status_code=status)


@serve.ingress(app)
class RouterIngress:
    def __init__(self, replicas, model: Optional[str], api_key: Optional[str], policy: str):
        from radixrt.runtime.models.loader import load_tokenizer

        self.replicas, self.policy = replicas, policy
        self.routed: dict[str, int] = {}  # replica id -> requests it answered, since the last policy swap
        self.tokenizer = load_tokenizer(model)
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    # ---- helpers -----------------------------------------------------------------------------------------
    def _denied(self, request: Request) -> Optional[JSONResponse]:
        if self.expected is None:
            return None
        got = request.headers.get("authorization", "").encode()
        if hmac.compare_digest(got, self.expected):
            return None
        return JSONResponse(
            error_body(
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                None,
                "invalid_request_error",
                "invalid_api_key",
            ),
            status_code=401,
        )

    def _tokens(self, path: str, body: dict) -> list[int]:
        """The routing key. Only needs to be stable per prefix, not byte-exact with the replica's."""
        enc = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        if path == "/v1/chat/completions":
            msgs = body.get("messages")
            try:
                return self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            except Exception:  # odd content parts: any stable rendering will do for routing
                return enc(json.dumps(msgs, sort_keys=True))
        prompt = body.get("input_ids") if path == "/generate" else body.get("prompt")
        if prompt is None and path == "/generate":
            prompt = body.get("text")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]  # a batch: route by its first prompt
        if isinstance(prompt, str):
            return enc(prompt)
        return [t for t in prompt if isinstance(t, int)] if isinstance(prompt, list) else []

    async def _forward(self, request: Request, path: str) -> Any:
        denied = self._denied(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return _err(400, "the request body is not valid JSON", "body")
        if not isinstance(body, dict):
            return _err(400, "the request body must be a JSON object", "body")
        session = request.headers.get("x-session-id") or body.get("session_id")
        req = {
            "tokens": self._tokens(path, body),
            "session": session,
            "path": path,
            "body": body,
            "policy": self.policy,
        }
        if body.get("stream"):
            return StreamingResponse(self._stream(req), media_type="text/event-stream")
        try:
            out = await self.replicas.remote(req)
        except REPLICA_DIED as e:
            return _err(
                503,
                f"the replica serving this request died: {type(e).__name__}: {str(e)[:300]}; "
                "the other replicas keep serving, retry",
                None,
                "service_unavailable",
            )
        self.routed[out["replica"]] = self.routed.get(out["replica"], 0) + 1
        return JSONResponse(out["body"], status_code=out["status"], headers={"X-Radixrt-Replica": out["replica"]})

    async def _stream(self, req: dict):
        try:
            async for chunk in self.replicas.options(stream=True, method_name="stream").remote(req):
                yield chunk
        except REPLICA_DIED as e:
            err = error_body(f"the replica serving this request died: {type(e).__name__}", None, "service_unavailable")
            yield f"data: {json.dumps(err)}\n\n".encode()

    # ---- routes ------------------------------------------------------------------------------------------
    @app.get("/health")
    async def health(self):
        """200 with the number of live replicas once at least one answers, else 503."""
        try:
            reps = await self.replicas.broadcast("stats").results_async(timeout_s=STATS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - any failure here means "not healthy"
            return _err(503, f"no replica answered: {type(e).__name__}: {e}", None, "service_unavailable")
        if not reps:
            return _err(503, "no replica is up yet", None, "service_unavailable")
        return {"status": "ok", "replicas": len(reps)}

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._forward(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._forward(request, "/v1/completions")

    @app.post("/generate")
    async def generate(self, request: Request):
        return await self._forward(request, "/generate")

    @app.get("/v1/models")
    async def models(self, request: Request):
        denied = self._denied(request)
        if denied is not None:
            return denied
        out = await self.replicas.remote({"tokens": [], "path": "/v1/models", "method": "GET"})
        return JSONResponse(out["body"], status_code=out["status"])

    @app.get("/router/stats")
    async def stats(self, request: Request):
        """Per replica: its radix cache's hit tokens / query tokens and pids; plus the requests it answered."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        reps = await self.replicas.broadcast("stats").results_async(timeout_s=STATS_TIMEOUT_S)
        return {"policy": self.policy, "replicas": sorted(reps, key=lambda r: r["replica"]), "routed": self.routed}

    @app.post("/router/policy")
    async def set_policy(self, request: Request):
        """Swap the routing policy at run time (A/B runs): ``{"policy": "round_robin", "flush": true}``;
        resets the answered counters, and with ``flush`` empties every replica's cache."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        from radixrt.runtime.config_check import ROUTER_POLICIES

        body = await request.json()
        policy = body.get("policy") if isinstance(body, dict) else None
        if policy not in ROUTER_POLICIES:
            return _err(400, f"policy must be one of {ROUTER_POLICIES}, got {policy!r}", "policy")
        self.policy, self.routed = policy, {}
        if body.get("flush"):
            await self.replicas.broadcast("flush").results_async(timeout_s=STATS_TIMEOUT_S)
        return {"policy": policy}
