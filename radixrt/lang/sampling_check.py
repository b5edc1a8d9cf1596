"""The DSL's sampling arguments checked where they are written (``gen``, ``select``, ``run``), with the
server's ranges (``runtime/sampling/params.py:normalize``), so a bad value is a ``ValueError`` naming the
argument at once instead of a ``RequestError`` on ``state.error()`` when the program reaches the call.

Its own file because ``radixrt.lang`` reaches the runtime only through the Engine and the wire structs
(``[tool.importlinter]``): the ranges are restated here, in SGLang's names (``max_new_tokens`` ...).
"""

from __future__ import annotations

import math
from typing import Any

# name -> (low, high, low open, integer); None: unbounded on that side
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "max_new_tokens": (0, None, False, True),
    "min_new_tokens": (0, None, False, True),
    "temperature": (0, None, False, False),
    "top_p": (0, 1, True, False),
    "top_k": (-1, None, False, True),
    "min_p": (0, 1, False, False),
    "frequency_penalty": (-2, 2, False, False),
    "presence_penalty": (-2, 2, False, False),
    "repetition_penalty": (0, 2, True, False),
    "seed": (0, None, False, True),
    "logprob_start_len": (-1, None, False, True),
    "top_logprobs_num": (0, None, False, True),
}
FLAGS = ("ignore_eos", "return_logprob", "return_text_in_logprobs", "speculative")


def check_sampling(values: dict[str, Any]) -> None:
    """Check the set (non-None) entries of ``values`` (SGLang's sampling parameter names).

    Raises:
        ValueError: naming the first bad field: a number out of its range or of the wrong type, ``top_k``
            0, a stop string that is empty or not a string, a stop token id that is not an int >= 0, a flag
            that is not a bool, or ``min_new_tokens`` above ``max_new_tokens``.
    """
    for name, (lo, hi, lo_open, integer) in RANGES.items():
        v = values.get(name)
        if v is None:
            continue
        kind = "an int" if integer else "a number"
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must be {kind}, got {v!r}")
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            bounds = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
            raise ValueError(f"{name} must be in {bounds}, got {v!r}")
    if values.get("top_k") == 0:
        raise ValueError("top_k must be -1 (off) or >= 1, got 0")
    lo, hi = values.get("min_new_tokens"), values.get("max_new_tokens")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_new_tokens ({lo}) must be <= max_new_tokens ({hi})")
    for name in FLAGS:
        if values.get(name) is not None and not isinstance(values[name], bool):
            raise ValueError(f"{name} must be a bool, got {values[name]!r}")
    stop = values.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
    ids = values.get("stop_token_ids")
    if ids is not None and (
        not isinstance(ids, (list, tuple))
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
    ):
        raise ValueError(f"stop_token_ids must be a list of token ids (ints >= 0), got {ids!r}")
