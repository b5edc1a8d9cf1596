"""Request and response models of every route, for ``/openapi.json`` and ``/docs``.

The OpenAI routes read their bodies with :mod:`.openai_protocol`'s models; ``/generate`` is checked by
:mod:`.native_body` and the Engine's rules, and :class:`GenerateRequest` describes that body. Responses are
built as plain dicts (msgspec JSON); the models here describe them, and the Schemathesis fuzz test checks
every answer against them.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- errors --------------------------------------------------------------------------------------------
class ErrorDetail(_Out):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(_Out):
    error: ErrorDetail


# ---- OpenAI --------------------------------------------------------------------------------------------
class PromptTokensDetails(_Out):
    cached_tokens: int


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatResponseMessage(_Out):
    role: str
    content: Optional[str]
    tool_calls: Optional[list[dict[str, Any]]] = None


class ChatChoice(_Out):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[dict[str, Any]]
    finish_reason: Optional[str]


class ChatCompletionResponse(_Out):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: Optional[str]
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: Optional[dict[str, Any]]
    finish_reason: Optional[str]


class CompletionResponse(_Out):
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: Optional[str]
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(_Out):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    max_model_len: Optional[int]


class ModelList(_Out):
    object: str
    data: list[ModelCard]


# ---- native --------------------------------------------------------------------------------------------
class SamplingParamsBody(BaseModel):
    """SGLang's ``sampling_params`` (every key of its ``SamplingParams``, plus radixrt's ``seed``,
    ``choices`` and ``any_whitespace``); see docs/compatibility.md."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: Optional[int] = 128
    min_new_tokens: int = 0
    n: int = 1
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: Optional[dict[str, float]] = None
    stream_interval: Optional[int] = None
    custom_params: Optional[dict[str, Any]] = None
    seed: Optional[int] = None
    sampling_seed: Optional[int] = None
    json_schema: Optional[Union[str, dict[str, Any]]] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    choices: Optional[list[str]] = None
    any_whitespace: bool = False


class GenerateRequest(BaseModel):
    """SGLang's ``/generate`` body: exactly one of ``text`` and ``input_ids``."""

    model_config = ConfigDict(extra="allow")
    text: Optional[Union[str, list[str]]] = None
    input_ids: Optional[Union[list[int], list[list[int]]]] = None
    sampling_params: Optional[Union[SamplingParamsBody, list[SamplingParamsBody]]] = None
    return_logprob: bool = False
    logprob_start_len: Optional[int] = None
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: Optional[Union[str, list[str]]] = None
    cache_salt: Optional[str] = None
    session_params: Optional[dict[str, Any]] = None
    session_id: Optional[str] = None


class GenerateOutput(_Out):
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


class AbortRequest(BaseModel):
    rid: Optional[str] = None
    abort_all: bool = False  # every request in flight (SGLang's field); excludes rid


class OpenSessionRequest(BaseModel):
    capacity_of_str_len: int
    session_id: Optional[str] = None
    timeout: Optional[float] = None  # seconds idle before the session closes itself


class CloseSessionRequest(BaseModel):
    session_id: str


class Status(_Out):
    status: str


class Success(_Out):
    success: bool
    message: Optional[str] = None


class ModelInfo(_Out):
    model_path: str
    tokenizer_path: str
    is_generation: bool


class ServerInfo(_Out):
    """Every ServerArgs field, then the scheduler's state (see /get_server_info)."""

    cache: dict[str, Any]
    num_running: int
    num_waiting: int
    context_length: int
    max_total_tokens: int
    model_name: str
    version: str
    process_ids: dict[str, int] = Field(default_factory=dict)
    restarts: dict[str, int] = Field(
        default_factory=dict,
        description=("children restarted since start, by the process that died: scheduler, detokenizer, tp_rank"),
    )
    num_in_flight: int = Field(
        0,
        description=(
            "requests admitted by the main process and not yet finished (bounded by --max-running-requests + "
            "--max-queued-requests; the SIGTERM drain waits for them)"
        ),
    )
    memory: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "bytes: weight_bytes (as held), kv_pool_bytes, the scheduler's rss_bytes and peak_rss_bytes, and "
            "peak_rss_by_process (each server process, and their total); kv_dtype, the KV pool's element type "
            "(fp32, fp16, bf16, int8)"
        ),
    )


# Models that describe the native request bodies (routes read them by hand, so FastAPI does not list them
# itself); the OpenAI routes' request models are openai/protocol.py's, added by http_server.
REQUEST_MODELS = (GenerateRequest, AbortRequest, OpenSessionRequest, CloseSessionRequest)
_ERRORS = {400: "bad input", 404: "no such object", 503: "the model is loading, or a child process died"}


def doc(response=None, request=None, stream: bool = False, errors=(400, 503), text: bool = False) -> dict:
    """Keyword arguments of a route decorator declaring its models: ``request`` (a body model), 200 as
    ``response`` (JSON; plus an event stream with ``stream``; plain text with ``text``), and error
    bodies for ``errors``."""
    ok: dict[str, Any] = {"description": "OK"}
    if response is not None:
        ok["model"] = response
    if stream:
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    if text:
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    responses: dict[Any, Any] = {200: ok}
    for code in errors:
        responses[code] = {"model": ErrorResponse, "description": _ERRORS.get(code, "error")}
    out: dict[str, Any] = {"responses": responses}
    if request is not None:
        out["openapi_extra"] = {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}},
            }
        }
    return out


def add_request_schemas(schema: dict, models: tuple = REQUEST_MODELS) -> dict:
    """Put ``models`` (pydantic request models; :data:`REQUEST_MODELS` and the OpenAI routes' own) and the
    models they use into an OpenAPI document's components."""
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for m in models:
        js = m.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            comps.setdefault(name, sub)
        comps[m.__name__] = js
    return schema
