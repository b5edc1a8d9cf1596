"""Agent sessions: a session pins its history's KV in the radix tree between calls.

An agent calls the model, runs a tool for seconds, then calls again with everything so far plus the tool's
answer. Under memory pressure LRU would evict that history while the tool runs; a session keeps it.

- ``open`` (SGLang's ``/open_session``: ``capacity_of_str_len``, ``session_id``, ``timeout``) starts one.
- A request joins a session in one of two ways:
  - ``session_params`` (SGLang's ``{id, rid, offset, replace, drop_previous_output}``): the request's ids
    are appended to the session's history (the full sequence of request ``rid``, default the latest one;
    cut at ``offset``; without its output if ``drop_previous_output``);
  - ``session_id`` (radixrt's OpenAI ``X-Session-Id`` / ``extra_body.session_id`` and the DSL): the request
    already holds the whole history; the session only pins it.
- Pinning. When a session's request finishes, the lock it held on the deepest cached node of its sequence
  (``lock_ref``) passes to the session instead of being released, and the previous pin is dropped. Pinned
  pages are protected: free + evictable + protected = total still holds.
- Release. ``close``; TTL expiry (``timeout`` seconds after the last use); ``--max-pinned-tokens`` (oldest
  session first); and memory pressure: when admission or decode cannot get pages, the least recently used
  pin is dropped before anything waits or is preempted. Its pages stay in the tree as evictable.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import SessionParams


@dataclass
class Session:
    id: str
    capacity: int  # tokens of context a request may reach (0: no cap)
    timeout: Optional[float]  # seconds of idleness before the session closes (None: never)
    last_used: float
    # rid -> (its full sequence: prompt + output, its prompt length), in the order the requests finished
    history: dict[str, tuple[list[int], int]] = field(default_factory=dict)
    node: Any = None  # the pinned TreeNode (its lock_ref is held), or None
    pinned_tokens: int = 0
    active: int = 0  # requests of the session not yet finished (no expiry meanwhile)


class TurnClock:
    """The session manager's clock under --tp: one value per loop turn, rank 0's (``set`` by the loop
    before each turn), so TTLs expire alike on every rank."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def set(self, now: float) -> None:
        """This turn's time (seconds, ``time.monotonic()`` on rank 0)."""
        self.now = now

    def __call__(self) -> float:
        return self.now


class SessionManager:
    """Sessions of one scheduler. ``tree`` is the RadixCache (None: sessions still resolve history but
    nothing is pinned). ``max_pinned_tokens`` caps the pinned tokens summed over sessions (None: no cap)."""

    def __init__(self, tree, max_pinned_tokens: Optional[int] = None, clock=time.monotonic):
        self.tree, self.max_pinned_tokens, self.clock = tree, max_pinned_tokens, clock
        self.sessions: dict[str, Session] = {}

    # ---- open / close ------------------------------------------------------------------------------------
    def open(
        self, capacity_of_str_len: int = 0, session_id: Optional[str] = None, timeout: Optional[float] = None
    ) -> Optional[str]:
        """Start a session. Returns its id, or None when ``session_id`` is already open."""
        sid = session_id or uuid.uuid4().hex
        if sid in self.sessions:
            return None
        self.sessions[sid] = Session(sid, max(int(capacity_of_str_len or 0), 0), timeout, self.clock())
        return sid

    def close(self, session_id: str) -> bool:
        """End a session and drop its pin. False when it is not open."""
        s = self.sessions.pop(session_id, None)
        if s is None:
            return False
        self._unpin(s)
        return True

    def expire(self) -> int:
        """Close every session idle (no request in flight) for longer than its timeout. Returns how many."""
        now = self.clock()
        dead = [
            s.id
            for s in self.sessions.values()
            if s.timeout is not None and not s.active and now - s.last_used > s.timeout
        ]
        for sid in dead:
            self.close(sid)
        return len(dead)

    # ---- requests ----------------------------------------------------------------------------------------
    def resolve(
        self, session_id: Optional[str], params: Optional[SessionParams], input_ids: list[int]
    ) -> tuple[Optional[Session], list[int]]:
        """The session a request belongs to and its full input ids.

        Raises:
            ValidationError: (``param`` ``session_params`` or ``session_id``, the form used) unknown session,
                unknown ``session_params.rid``, or a context beyond the session's capacity.
        """
        sid = params.id if params is not None else session_id
        if sid is None:
            return None, input_ids
        form = "session_params" if params is not None else "session_id"
        s = self.sessions.get(sid)
        if s is None:
            raise ValidationError(f"{form}: no open session {sid!r}", form)
        if params is not None and params.rid is not None and params.rid not in s.history:
            raise ValidationError(f"session_params.rid: no finished request {params.rid!r} in session {sid!r}", form)
        ids = input_ids
        if params is not None and s.history:
            rid = params.rid if params.rid is not None else next(reversed(s.history))
            seq, prompt_len = s.history[rid]
            base = seq[:prompt_len] if params.drop_previous_output else seq
            if params.offset is not None:
                if params.offset > len(base):
                    raise ValidationError(
                        f"session_params.offset {params.offset} is beyond the {len(base)} tokens of request {rid!r}",
                        form,
                    )
                base = base[: params.offset]
            if params.replace:  # the new request replaces what followed rid in the session
                keys = list(s.history)
                for k in keys[keys.index(rid) + 1 :]:
                    del s.history[k]
            ids = base + input_ids
        elif params is not None and params.offset:
            raise ValidationError(f"session_params.offset {params.offset}: session {sid!r} has no history yet", form)
        if s.capacity and len(ids) > s.capacity:
            raise ValidationError(
                f"{form}: the context ({len(ids)} tokens) exceeds the session's capacity_of_str_len ({s.capacity})",
                form,
            )
        s.active += 1
        s.last_used = self.clock()
        return s, ids

    def _open(self, s: Optional[Session]) -> bool:
        """``s`` is still open: a request keeps its Session object, so after a close and a reopen under the
        same id it never touches the new session."""
        return s is not None and self.sessions.get(s.id) is s

    def done(self, s: Session) -> None:
        """A request of session ``s`` finished (any reason): the idle clock restarts."""
        if self._open(s):
            s.active -= 1
            s.last_used = self.clock()

    def record(self, s: Session, rid: str, prompt_len: int, seq: list[int]) -> None:
        """Remember a finished request's full sequence (``prompt_len`` tokens of prompt) for ``rid``."""
        if self._open(s):
            s.history[rid] = (list(seq), prompt_len)

    def open_req(self, r: Any) -> Optional[str]:
        """Start a session for an ``OpenSessionReq`` (expired ones end first). Returns its id; None when
        ``r.session_id`` is taken."""
        self.expire()
        return self.open(r.capacity_of_str_len, r.session_id, r.timeout)

    def take_over(self, req: Any, req_pages: Any) -> None:
        """A finished session request's lock on its deepest cached node passes to its session (``req_pages``:
        the scheduler's ReqPages); the request's own pages go to the tree as usual."""
        node, tokens = req_pages.release(req, keep_lock=True)
        self.record(req.session, req.rid, len(req.input_ids), req.fill_ids)
        self.pin(req.session, node, tokens)

    def pin(self, s: Optional[Session], node: Any, tokens: int) -> bool:
        """Hand ``node``'s lock (held by the caller) to session ``s``; it replaces the session's pin.

        Returns False, and unlocks ``node``, when the session is closed, ``tokens`` is 0 (less than a page
        cached: nothing to pin; the session's older pin goes too) or ``tokens`` alone exceed
        ``max_pinned_tokens``. Older sessions lose their pins to make room under the cap.
        """
        cap = self.max_pinned_tokens
        if not self._open(s) or node is None or not tokens or (cap is not None and tokens > cap):
            if node is not None:
                self.tree.dec_lock_ref(node)
            if self._open(s) and not tokens:
                self._unpin(s)
            return False
        self._unpin(s)
        while cap is not None and self.pinned_tokens + tokens > cap and self.unpin_oldest():
            pass
        s.node, s.pinned_tokens, s.last_used = node, tokens, self.clock()
        return True

    # ---- memory ------------------------------------------------------------------------------------------
    @property
    def pinned_tokens(self) -> int:
        """Tokens pinned, summed over sessions (a prefix two sessions share counts twice)."""
        return sum(s.pinned_tokens for s in self.sessions.values())

    def unpin_oldest(self) -> bool:
        """Drop the pin of the least recently used pinned session. False when nothing is pinned."""
        pinned = [s for s in self.sessions.values() if s.node is not None]
        if not pinned:
            return False
        self._unpin(min(pinned, key=lambda s: s.last_used))
        return True

    def _unpin(self, s: Session) -> None:
        if s.node is not None:
            self.tree.dec_lock_ref(s.node)
        s.node, s.pinned_tokens = None, 0

    def stats(self) -> dict:
        return {
            "num_sessions": len(self.sessions),
            "pinned_tokens": self.pinned_tokens,
            "pinned_sessions": sum(s.node is not None for s in self.sessions.values()),
        }
