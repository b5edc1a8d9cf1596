"""What a generate call gives, before validation: the one argument of
:func:`~radixrt.runtime.tokenizer.validation.build_requests`, shared by the Engine, ``/generate`` and the
OpenAI routes (each fills the fields it has; the rest keep their defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class GenerateInput:
    """One call's input, as the client sent it (nothing is checked here: ``build_requests`` raises a
    ``ValidationError`` naming the field).

    Attributes:
        prompt: a string, or a list of strings (a batch); exactly one of ``prompt`` and ``input_ids``.
        input_ids: token ids ``list[int]``, or a list of such lists.
        sampling_params: a dict, or one dict per prompt (see ``sampling.params.normalize``).
        return_logprob: whether to return logprobs; ``logprob_start_len`` the first prompt position whose
            input logprob is wanted (None: only the last; -1: none); ``top_logprobs_num`` top tokens per
            position (0..20).
        stream: stream the output (one prompt only).
        rid: the request id, or one per prompt (None: a fresh uuid each).
        cache_salt: a string that keeps this call's KV apart from other salts' in the radix tree.
        session_params: SGLang's ``{id, rid, offset, replace, drop_previous_output}`` (continue an open
            session); ``session_id``: the prompt already holds the session's history.
    """

    prompt: Any = None
    input_ids: Any = None
    sampling_params: Any = None
    return_logprob: Any = False
    logprob_start_len: Any = None
    top_logprobs_num: Any = 0
    stream: Any = False
    rid: Any = None
    cache_salt: Any = None
    session_params: Any = None
    session_id: Any = None
