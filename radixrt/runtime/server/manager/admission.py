"""Admission control of the main process: a bound on requests in flight, and the drain on SIGTERM.

- **Queue bound.** At most ``--max-running-requests + --max-queued-requests`` requests may be in flight
  (submitted and not finished, over every call). The default queue is one request per KV page of the
  pool: each waiting request needs at least one page to ever run, so a longer queue only waits. A call
  that would go beyond gets a 503 ``queue_full`` with ``Retry-After: 1`` (OpenAI's clients retry on it);
  a prompt that can never fit is still refused at once, with a 400 (validation).
- **Drain.** On SIGTERM (:func:`drain`): new calls get 503 and ``/health`` 503, running requests may
  finish for up to ``--drain-timeout`` seconds, then the rest are aborted (streams end with an error
  event) and the server exits with status 0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from radixrt.runtime.server.http.errors import ApiError

logger = logging.getLogger("radixrt.server")
RETRY_AFTER_S = 1
DRAIN_POLL_S = 0.05  # only while draining: how often the in-flight count is looked at


class Admission:
    """``draining``: the reason new calls are refused while shutting down, else None."""

    def __init__(self, max_running: int, max_queued: Optional[int]):
        self.max_running = max_running
        self.max_queued = max_queued  # None until the pool size is known (set_pool)
        self.draining: Optional[str] = None
        self.refused = 0  # calls answered 503 queue_full since start

    def set_pool(self, pages: int) -> None:
        """Default ``max_queued``: one request per KV page (``pages``: the pool's pages)."""
        if self.max_queued is None:
            self.max_queued = pages

    def drain(self, reason: str) -> None:
        """Refuse every new call from now on with a 503 saying ``reason`` (a graceful shutdown)."""
        self.draining = reason

    @property
    def limit(self) -> Optional[int]:
        return None if self.max_queued is None else self.max_running + self.max_queued

    def check(self, in_flight: int, n: int) -> None:
        """Raises ApiError 503 when draining, or when ``n`` more requests (a call's prompts x its ``n``
        choices) would exceed the bound; 400 when ``n`` alone exceeds it: waiting would never make room."""
        if self.draining is not None:
            raise ApiError(self.draining, status=503, type="service_unavailable")
        limit = self.limit
        if limit is not None and n > limit:
            raise ApiError(
                f"n: this call makes {n} requests (prompts x n), more than the server ever holds in "
                f"flight ({limit}: --max-running-requests {self.max_running} + --max-queued-requests "
                f"{self.max_queued})",
                status=400,
                param="n",
            )
        if limit is not None and in_flight + n > limit:
            self.refused += 1
            raise ApiError(
                f"the server is at capacity: {in_flight} requests in flight, at most {limit} "
                f"(--max-running-requests {self.max_running} + --max-queued-requests "
                f"{self.max_queued}); retry after {RETRY_AFTER_S} s",
                status=503,
                type="service_unavailable",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )


async def drain(tm, timeout: float, stop: Callable[[], None]) -> None:
    """Stop admitting, wait up to ``timeout`` seconds for ``tm``'s in-flight requests to finish, abort the
    rest (their clients get a 503 error saying so), then call ``stop()`` (ends the HTTP server)."""
    adm = tm.admission
    adm.drain("the server is shutting down")
    n = len(tm.states)
    if n:
        logger.warning("SIGTERM: draining %d requests in flight (up to %g s)", n, timeout)
    deadline = time.monotonic() + timeout
    while tm.states and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)
    if tm.states:
        rids = list(tm.states)
        logger.warning("drain timeout (%g s): aborting %d requests", timeout, len(rids))
        for rid in rids:
            tm.abort(rid)
        tm.fail(f"the server is shutting down: the request did not finish within --drain-timeout {timeout:g} s")
    stop()
