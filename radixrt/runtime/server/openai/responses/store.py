"""Stored responses (``store: true``, OpenAI's default): ``GET``/``DELETE /v1/responses/{id}`` and
``previous_response_id``. Bounded (``--response-store-size``, oldest dropped first).

A stored response also pins its conversation as an agent session (``open_session`` with
``--response-session-ttl``): the request that continues it joins the same session, so the pages of
the previous turn (prompt and output) stay in the tree until then; the next turn is a cache hit by
construction rather than by luck of eviction. The session closes when its last stored response is deleted
or dropped, or after the TTL idle (the scheduler's).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

# a session this close to its idle TTL is not reused (it may expire on the way): a fresh one is opened
TTL_MARGIN = 0.8


@dataclass
class Stored:
    response: dict  # the Response object as returned
    messages: list  # the conversation after it, as template-ready chat messages (instructions excluded)
    session_id: Optional[str]
    salt: Optional[str]
    input_items: list = field(default_factory=list)  # this request's own input, as items with ids


@dataclass
class ResponseStore:
    capacity: int
    ttl: float
    _d: "OrderedDict[str, Stored]" = field(default_factory=OrderedDict)
    _used: dict = field(default_factory=dict)  # session id -> monotonic time of its last request

    def get(self, rid: str) -> Optional[Stored]:
        return self._d.get(rid)

    def session_for(self, prev: Optional[Stored]) -> Optional[str]:
        """The session to continue ``prev``'s conversation in, or None when it has none or it is near its TTL."""
        if prev is None or prev.session_id is None:
            return None
        last = self._used.get(prev.session_id)
        if last is None or time.monotonic() - last > self.ttl * TTL_MARGIN:
            return None
        return prev.session_id

    def touch(self, session_id: str) -> None:
        self._used[session_id] = time.monotonic()

    def put(self, rid: str, s: Stored) -> list[str]:
        """Store ``s``; returns the sessions no stored response uses any more (to close)."""
        if self.capacity == 0:
            return [s.session_id] if s.session_id else []
        self._d[rid] = s
        dropped = []
        while len(self._d) > self.capacity:
            dropped.append(self._d.popitem(last=False)[1])
        return self._orphans(dropped)

    def delete(self, rid: str) -> tuple[bool, list[str]]:
        """``(found, sessions to close)``."""
        s = self._d.pop(rid, None)
        return (s is not None, self._orphans([s] if s else []))

    def _orphans(self, gone: list[Stored]) -> list[str]:
        live = {s.session_id for s in self._d.values()}
        out = []
        for s in gone:
            if s.session_id and s.session_id not in live and s.session_id not in out:
                out.append(s.session_id)
                self._used.pop(s.session_id, None)
        return out
