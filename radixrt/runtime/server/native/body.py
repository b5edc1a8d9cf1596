"""SGLang's native ``/generate`` body (also the DSL socket's generate body): parsed in, answered out.

The body's keys are :data:`GENERATE_KEYS`; sampling parameters are checked later, with the Engine's rules
(:func:`radixrt.runtime.tokenizer.validation.build_requests`). Errors are :class:`ValidationError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Union

from radixrt.runtime.tokenizer.generate_input import GenerateInput
from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import SamplingParams

GENERATE_KEYS = (
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
    "rid",
    "cache_salt",
    "session_params",
    "session_id",
)
# SGLang's other GenerateReqInput keys: accepted and ignored (no effect here) ...
IGNORED_KEYS = {
    "log_metrics": "every request is counted in /metrics",
    "data_parallel_rank": "one scheduler: there is no data parallelism to pick a rank of",
}
# ... or refused with the reason (a set value is a 400 naming the key; null/false/empty is accepted).
REFUSED_KEYS = {
    "input_embeds": "the model takes token ids only (text or input_ids)",
    "image_data": "the model is text-only",
    "video_data": "the model is text-only",
    "audio_data": "the model is text-only",
    "modalities": "the model is text-only",
    "token_ids_logprob": "logprobs of chosen token ids are not computed; use top_logprobs_num",
    "lora_path": "no LoRA adapter is loaded",
    "custom_logit_processor": "custom logit processors are not supported (they would run user code)",
    "return_hidden_states": "hidden states are not returned",
    "bootstrap_host": "prefill/decode disaggregation is not supported",
    "bootstrap_port": "prefill/decode disaggregation is not supported",
    "bootstrap_room": "prefill/decode disaggregation is not supported",
}


@dataclass
class GenerateBody:
    """A /generate body whose top-level keys and flags are checked (the prompt and sampling params are not)."""

    text: Any = None
    input_ids: Any = None
    sampling_params: Any = None
    return_logprob: bool = False
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Any = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: Optional[Union[str, list[str]]] = None
    cache_salt: Any = None
    session_params: Any = None  # SGLang's {id, rid, offset, replace, drop_previous_output}
    session_id: Any = None  # radixrt: the prompt holds the history; the session pins it


def parse_generate_body(body: Any) -> GenerateBody:
    """Check a /generate body's keys, flags and ``rid``.

    Raises:
        ValidationError: not an object (param None), a sampling parameter at the top level (any value but
            null), an unknown key with a value (param: that key; the message lists the known keys), a flag
            that is not a boolean, a bad ``rid``.
    """
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object", None)
    unset = (None, False, [], {}, "")
    for k, why in REFUSED_KEYS.items():
        if body.get(k) not in unset:
            raise ValidationError(f"{k} is not supported: {why}", k)
    # a sampling parameter beside sampling_params is refused whatever its value: "temperature": 0 or
    # "speculative": false would otherwise pass as an unset unknown key and be silently ignored
    for k, v in body.items():
        if k in SamplingParams.__struct_fields__ and k not in GENERATE_KEYS and v is not None:
            raise ValidationError(
                f"{k} is a sampling parameter: send it inside sampling_params, not at the top level of the body", k
            )
    unknown = [
        k
        for k, v in body.items()
        if k not in GENERATE_KEYS and k not in IGNORED_KEYS and k not in REFUSED_KEYS and v not in unset
    ]
    if unknown:
        raise ValidationError(f"unknown field(s) {sorted(unknown)}; known: {list(GENERATE_KEYS)}", unknown[0])
    b = GenerateBody(**{k: body[k] for k in GENERATE_KEYS if k in body})
    for name, v in (
        ("stream", b.stream),
        ("return_logprob", b.return_logprob),
        ("return_text_in_logprobs", b.return_text_in_logprobs),
    ):
        if not isinstance(v, bool):
            raise ValidationError(f"{name} must be a boolean, got {v!r}", name)
    rid = b.rid
    if rid is not None and not (
        isinstance(rid, str) or (isinstance(rid, list) and all(isinstance(x, str) for x in rid))
    ):
        raise ValidationError("rid must be a string or a list of strings", "rid")
    return b


class NativeCall:
    """A /generate call (HTTP or DSL) after validation: ``result()`` or ``chunks()``."""

    def __init__(self, batch, single: bool, stream: bool, return_logprob: bool):
        self.batch, self.single, self.stream, self.return_logprob = batch, single, stream, return_logprob

    async def result(self) -> Any:
        """The SGLang response: one dict (one prompt given) or a list of them."""
        outs = await self.batch.wait()
        ds = [o.to_dict(self.return_logprob) for o in outs]
        return ds[0] if self.single else ds

    async def chunks(self) -> AsyncIterator[dict]:
        """Streaming (one prompt): one cumulative dict per ``stream_interval`` new tokens (sampling param,
        default 1: every update), the last one finished."""
        o = self.batch.outs[0]
        every = self.batch.reqs[0].sampling_params.stream_interval
        sent = 0
        while not self.batch.finished:
            await self.batch.next()
            if self.batch.finished or len(o.output_ids) - sent >= every:
                sent = len(o.output_ids)
                yield o.to_dict(self.return_logprob)


async def native_generate(tm, body: Any) -> NativeCall:
    """Validate a /generate body (:func:`parse_generate_body`) and queue it on ``tm`` (the TokenizerManager).

    Raises:
        ValidationError: bad input (``param`` names the field).
        ApiError: 503 when not ready.
    """
    b = parse_generate_body(body)
    reqs, single = await tm.build(
        GenerateInput(
            prompt=b.text,
            input_ids=b.input_ids,
            sampling_params=b.sampling_params,
            return_logprob=b.return_logprob,
            logprob_start_len=b.logprob_start_len,
            top_logprobs_num=b.top_logprobs_num,
            stream=b.stream,
            rid=b.rid,
            cache_salt=b.cache_salt,
            session_params=b.session_params,
            session_id=b.session_id,
        )
    )
    if b.stream and not single:
        many = isinstance(b.text, list) or (
            isinstance(b.input_ids, list) and b.input_ids and isinstance(b.input_ids[0], list)
        )
        if many:
            raise ValidationError("stream: stream=true takes one prompt", "stream")
        raise ValidationError("n: stream=true takes one sample; n > 1 is answered without streaming", "n")
    batch = await tm.submit(reqs, b.return_text_in_logprobs)
    return NativeCall(batch, single, b.stream, b.return_logprob)
