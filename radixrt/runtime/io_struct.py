"""msgspec Structs that cross process boundaries (ZMQ). Nothing is ever pickled.

One request id (``rid``) follows a request through every process:
tokenizer manager -> scheduler -> detokenizer -> tokenizer manager -> client.
"""

from __future__ import annotations

from typing import Optional, Union

import msgspec


class SamplingParams(msgspec.Struct, kw_only=True):
    """Per-request sampling parameters. Validated by :func:`radixrt.runtime.sampling.params.normalize`.

    ``max_new_tokens=None`` means "the room left in the context" (:func:`room`; documented OpenAI-server rule).
    Grammar fields (``json_schema``, ``regex``, ``ebnf``, ``structural_tag``) are mutually exclusive;
    ``choices`` is turned into a regex before it reaches the scheduler.
    """

    max_new_tokens: Optional[int] = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: Optional[int] = None
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    any_whitespace: bool = False
    # the grammar applies only after the output contains these ids (a reasoning parser's end marker)
    reasoning_end_ids: list[int] = []
    # SGLang's keys added for the frontend's wire contract (issue 13)
    n: int = 1  # samples per prompt; expanded into n requests by validation
    spaces_between_special_tokens: bool = True  # detokenizer: a space around special tokens (with skip off)
    logit_bias: dict[int, float] = {}  # token id -> added to its logit before sampling
    stream_interval: int = 1  # streamed /generate: a chunk every this many tokens
    speculative: bool = True  # False: this request never carries draft tokens


class SessionParams(msgspec.Struct, kw_only=True):
    """SGLang's ``session_params`` of ``/generate``: continue session ``id`` after request ``rid`` (default:
    its latest), its sequence cut at ``offset`` tokens, without its output if ``drop_previous_output``;
    ``replace`` drops what followed ``rid``. The request's own ids are appended (see runtime/scheduler/session.py)."""

    id: str
    rid: Optional[str] = None
    offset: Optional[int] = None
    replace: bool = False
    drop_previous_output: bool = False


class GenerateReq(msgspec.Struct, tag=True, kw_only=True):
    """A tokenized request, sent by the tokenizer manager (or the in-process Engine) to the scheduler."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no input logprobs
    top_logprobs_num: int = 0
    stream: bool = False
    cache_salt: Optional[str] = None
    session_params: Optional[SessionParams] = None  # append to a session's history (SGLang)
    session_id: Optional[str] = None  # the prompt holds the history; the session pins it


class OpenSessionReq(msgspec.Struct, tag=True, kw_only=True):
    """SGLang's ``/open_session``. ``capacity_of_str_len``: the most tokens of context a session request may
    reach (0: no cap); ``timeout``: seconds of idleness before the session closes (None: never)."""

    capacity_of_str_len: int = 0
    session_id: Optional[str] = None
    timeout: Optional[float] = None


class CloseSessionReq(msgspec.Struct, tag=True, kw_only=True):
    session_id: str


class AbortReq(msgspec.Struct, tag=True):
    rid: str


class FlushCacheReq(msgspec.Struct, tag=True):
    pass


class GetInfoReq(msgspec.Struct, tag=True):
    top: int = 0  # > 0: also summarize the radix tree's ``top`` longest and most-hit prefixes


class InfoOut(msgspec.Struct, tag=True):
    """Scheduler state for /get_server_info: cache dict, queue lengths."""

    cache: dict
    num_running: int
    num_waiting: int
    flushed: Optional[bool] = None
    session_id: Optional[str] = None  # the answer to an OpenSessionReq (None: the id was taken)
    tree: Optional[dict] = None  # mem/tree_summary.py, when asked with GetInfoReq.top > 0
    memory: Optional[dict] = None  # ModelRunner.memory_stats(): weight and KV pool bytes, RSS (bytes)


class FinishStop(msgspec.Struct, tag="stop", tag_field="type"):
    """Finished on EOS or a stop token (``matched``: its id; None for EOS without a stop list entry) or a
    stop string (``matched``: the string)."""

    matched: Union[int, str, None]

    def as_dict(self) -> dict:
        return {"type": "stop", "matched": self.matched}


class FinishLength(msgspec.Struct, tag="length", tag_field="type"):
    """Finished at ``max_new_tokens`` or the context length: ``length`` output tokens."""

    length: int

    def as_dict(self) -> dict:
        return {"type": "length", "length": self.length}


class FinishAbort(msgspec.Struct, tag="abort", tag_field="type"):
    """Aborted: by the client, a drain, or a failure handling the request."""

    message: str

    def as_dict(self) -> dict:
        return {"type": "abort", "message": self.message}


class FinishError(msgspec.Struct, tag="error", tag_field="type"):
    """Refused for bad input the scheduler found (a session field, a grammar its backend gives up on:
    ``errors.refusal``): the caller gets ``status_code`` (400) naming ``param``, the field at fault. The
    SGLang-shaped dict (``as_dict``) is SGLang's FINISH_ABORT with its status code, as SGLang sends it."""

    message: str
    status_code: int = 400
    param: Optional[str] = None

    def as_dict(self) -> dict:
        return {"type": "abort", "message": self.message, "status_code": self.status_code, "param": self.param}


# Why a request finished: SGLang's finish_reason dicts ({"type": ..., ...}), typed; ``as_dict()`` gives
# the dict the HTTP and DSL outputs carry (meta_info.finish_reason), ``kind(r)`` the type.
FinishReason = Union[FinishStop, FinishLength, FinishAbort, FinishError]


def kind(reason: Optional[FinishReason]) -> Optional[str]:
    """``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` (the tag), or None while unfinished."""
    return None if reason is None else reason.__struct_config__.tag


# A logprob entry: (logprob, token_id). Top logprobs: a list of such pairs per position.
LogprobPair = tuple[float, int]


class TokenOut(msgspec.Struct, kw_only=True):
    """What one scheduler step produced for one request (deltas since the last TokenOut)."""

    rid: str
    new_token_ids: list[int]
    finished_reason: Optional[FinishReason] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    output_token_logprobs: list[LogprobPair] = []
    output_top_logprobs: list[list[LogprobPair]] = []
    # Sent once, with the first output: index i is the logprob of prompt token logprob_start_len + i.
    input_token_logprobs: Optional[list[Optional[LogprobPair]]] = None
    input_top_logprobs: Optional[list[Optional[list[LogprobPair]]]] = None
    stop_strings: list[str] = []
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


class BatchTokenOut(msgspec.Struct, tag=True):
    outs: list[TokenOut]


class StrOut(msgspec.Struct, kw_only=True):
    """Detokenized delta for one request. ``text_delta`` never holds a partial stop string or U+FFFD."""

    rid: str
    text_delta: str
    token: TokenOut


class BatchStrOut(msgspec.Struct, tag=True):
    outs: list[StrOut]


# ---- The DSL's socket (ZMQ DEALER -> the server's ROUTER on --zmq-port), msgpack-encoded ----------------
class DslRequest(msgspec.Struct, tag=True, kw_only=True):
    """Client -> server. ``op``: generate | abort | flush_cache | get_server_info | get_model_info.

    For ``generate``, ``body`` is exactly the JSON body of ``POST /generate`` (text or input_ids,
    sampling_params, return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs,
    stream, rid, cache_salt). For ``abort``, ``body = {"rid": ...}``.
    """

    req_id: str
    op: str
    body: dict = {}
    api_key: Optional[str] = None  # required (compared with --api-key) when the server has one


class DslReply(msgspec.Struct, tag=True, kw_only=True):
    """Server -> client. ``event``: chunk (one streamed /generate object, cumulative text), result
    (the final /generate object or list; or the op's answer), error (``data`` is an OpenAI-style
    error object: message, type, param, code)."""

    req_id: str
    event: str
    data: object = None


# ---- Process start-up -------------------------------------------------------------------------------------
class ReadyOut(msgspec.Struct, tag=True, kw_only=True):
    """Scheduler -> main (through the detokenizer), once: the model is loaded, or it failed to (``error``)."""

    error: Optional[str] = None
    model_name: str = ""
    context_length: int = 0
    vocab_size: int = 0
    max_total_tokens: int = 0
    page_size: int = 0


# What the scheduler sends to the detokenizer, and what the detokenizer sends to the main process.
SchedulerProcessOutput = Union[BatchTokenOut, InfoOut, ReadyOut]
DetokenizerOutput = Union[BatchStrOut, InfoOut, ReadyOut]


def room(n: int, context_length: int, pool_tokens: int) -> int:
    """New tokens a prompt of ``n`` tokens may generate when ``max_new_tokens`` is omitted: up to the context
    length or the KV pool's size (tokens), whichever is smaller."""
    return min(context_length, pool_tokens) - n
