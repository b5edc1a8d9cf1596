"""The request log (``--request-log FILE``): one JSON line per finished request, appended by the scheduler.

Fields of a line (times are Unix seconds, taken in the scheduler process; lengths are tokens):
  ``rid``            the request id;
  ``arrival``        when the scheduler received the request;
  ``admit``          its first admission into a batch (where ``cached_tokens`` were matched);
  ``prefill_done``   when its prompt's KV was complete (its first output token was sampled);
  ``finish``         when it finished;
  ``ttft``           ``prefill_done - arrival`` (seconds);
  ``prefill_chunks`` ``[[time, prompt tokens computed], ...]`` after each prefill chunk (each chunk's KV goes
                     into the tree at once, so a request admitted in between hits it);
  ``prompt_len``, ``output_len``;
  ``prompt_ids``, ``output_ids``   the token ids (token form, the default);
  ``page_size``, ``page_hashes``   instead of ids with ``--request-log-hash``: one 63-bit hash per whole page
                     of prompt + output, each chained on the one before (``page_hashes``), so equal hashes mean
                     equal prefixes and the text cannot be read back;
  ``cacheable_len``  prompt tokens it was allowed to take from the cache (the last prompt token, and any
                     whose input logprobs were asked for, are computed);
  ``cache_salt``     its cache namespace (in hash form, a hash of it), or null;
  ``cached_tokens``  prompt tokens served from the prefix cache;
  ``finish_reason``  ``stop`` / ``length`` / ``abort``.
A ``POST /flush_cache`` that emptied the cache writes ``{"event": "flush_cache", "time": T}``.
``radixrt profile`` replays either form through the radix tree (``runtime/profile``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import IO, Any, Optional

from radixrt.runtime.io_struct import kind
from radixrt.runtime.mem.page_hash import HASH_MASK, page_hashes  # noqa: F401 (re-exported)


def salt_hash(salt: Optional[str]) -> Optional[str]:
    return None if salt is None else hashlib.blake2b(salt.encode(), digest_size=8).hexdigest()


class RequestLog:
    """Appends one line per finished request to ``path`` (created if missing, never truncated). With
    ``hash_pages`` the ids are replaced by page hashes of ``page_size`` tokens. Raises OSError if the file
    cannot be opened."""

    def __init__(self, path: str, page_size: int, hash_pages: bool = False):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.path, self.page_size, self.hash_pages = path, page_size, hash_pages
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._f: Optional[IO[str]] = open(path, "a", buffering=1, encoding="utf-8")

    def write(
        self,
        *,
        rid: str,
        arrival: float,
        admit: Optional[float],
        prefill_done: Optional[float],
        finish: float,
        prompt_ids: list[int],
        output_ids: list[int],
        cacheable_len: int,
        cache_salt: Optional[str],
        cached_tokens: int,
        finish_reason: str,
        prefill_chunks: Optional[list[tuple[float, int]]] = None,
    ) -> None:
        """Append one finished request (times in Unix seconds)."""
        if self._f is None:
            return
        rec: dict = {
            "rid": rid,
            "arrival": arrival,
            "admit": admit,
            "prefill_done": prefill_done,
            "finish": finish,
            "ttft": None if prefill_done is None else prefill_done - arrival,
            "prefill_chunks": [list(c) for c in prefill_chunks or []],
            "prompt_len": len(prompt_ids),
            "output_len": len(output_ids),
        }
        if self.hash_pages:
            rec["page_size"] = self.page_size
            rec["page_hashes"] = page_hashes(list(prompt_ids) + list(output_ids), self.page_size)
            rec["cache_salt"] = salt_hash(cache_salt)
        else:
            rec["prompt_ids"], rec["output_ids"] = list(prompt_ids), list(output_ids)
            rec["cache_salt"] = cache_salt
        rec.update(cacheable_len=cacheable_len, cached_tokens=cached_tokens, finish_reason=finish_reason)
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def write_req(self, req: Any, now: float) -> None:
        """Append a finished scheduler ``Req`` (``request.py``: its ``t_arrival``, ``t_admit``,
        ``prefill_marks`` and ``cacheable_len``), finishing at ``now``."""
        first = next((t for t, n in req.prefill_marks if n >= len(req.input_ids)), None)
        reason = kind(req.finished_reason) or "abort"
        cacheable = req.cacheable_len if req.cacheable_len is not None else max(len(req.input_ids) - 1, 0)
        self.write(
            rid=req.rid,
            arrival=req.t_arrival,
            admit=req.t_admit,
            prefill_done=first,
            finish=now,
            prompt_ids=req.input_ids,
            output_ids=req.output_ids,
            cacheable_len=cacheable,
            cache_salt=req.cache_salt,
            cached_tokens=req.cached_tokens,
            finish_reason=reason,
            prefill_chunks=req.prefill_marks,
        )

    def write_flush(self, now: float) -> None:
        """Mark that the cache was flushed at ``now`` (the replay flushes its tree there too)."""
        if self._f is not None:
            self._f.write(json.dumps({"event": "flush_cache", "time": now}) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
