"""Read radixrt's request log (token or hash form, fields in ``radixrt/runtime/scheduler/request_log.py``) as
``ReplayReq`` lists in arrival order. (Plain OpenAI chat files: ``server/chat_log.py``, which renders them as
the server does.)"""

from __future__ import annotations

import json
from typing import Iterator

from radixrt.runtime.profile.replay import ReplayReq


def json_lines(path: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` per non-empty line; ValueError naming the line of one that is not a JSON
    object."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object")
            yield n, obj


def read_request_log(path: str, timed: bool = True) -> list[ReplayReq]:
    """Requests of a ``--request-log`` file, sorted by arrival. ``timed``: keep the admission, prefill and
    finish times (so requests in flight overlap as they did live); otherwise replay one after another.
    Raises ValueError naming the line and field of a malformed record."""
    out: list[tuple[float, ReplayReq]] = []
    for n, r in json_lines(path):
        if r.get("event") == "flush_cache":
            t = float(r.get("time", 0.0))
            out.append((t, ReplayReq(0, 0, [], flush=True, start=t if timed else None)))
            continue
        try:
            plen, olen = int(r["prompt_len"]), int(r["output_len"])
            if "page_hashes" in r:
                key, unit = [int(h) for h in r["page_hashes"]], int(r["page_size"])
            else:
                key, unit = [int(t) for t in r["prompt_ids"]] + [int(t) for t in r["output_ids"]], 1
            arrival = float(r["arrival"])
            req = ReplayReq(plen, olen, key, unit, r.get("cacheable_len"), r.get("cache_salt"))
            if timed:
                req.start = _time(r, "admit", arrival)
                done = _time(r, "prefill_done")
                if done is None and r.get("ttft") is not None:
                    done = arrival + float(r["ttft"])
                req.prefill_done, req.finish = done, _time(r, "finish")
                if r.get("prefill_chunks"):
                    req.chunks = [(float(t), int(k)) for t, k in r["prefill_chunks"]]
        except KeyError as e:
            raise ValueError(f"{path}:{n}: missing field {e}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: bad field value ({e})") from None
        out.append((arrival, req))
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


def _time(r: dict, key: str, default: float | None = None) -> float | None:
    """A timing field (seconds) of a log record, or ``default`` when absent."""
    return default if r.get(key) is None else float(r[key])
