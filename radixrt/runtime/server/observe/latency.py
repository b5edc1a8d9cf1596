"""Recent TTFT and ITL samples (seconds), kept in the main process for ``/cache_tree`` and ``/dashboard``
(Prometheus histograms, with ``--enable-metrics``, are the long-run record)."""

from __future__ import annotations

from collections import deque

import numpy as np

from radixrt.runtime.io_struct import kind


class LatencyWindow:
    """The last ``size`` TTFTs and the last ``size`` inter-token gaps. ``itl(dt, n)`` records ``n`` gaps of
    ``dt`` (a chunk of ``n`` tokens spread over the time since the previous chunk)."""

    def __init__(self, size: int = 4096):
        self._ttft: deque[float] = deque(maxlen=size)
        self._itl: deque[float] = deque(maxlen=size)
        self.ttft_count = 0  # every TTFT ever recorded (requests that produced a token)

    def ttft(self, dt: float) -> None:
        self._ttft.append(dt)
        self.ttft_count += 1

    def itl(self, dt: float, n: int = 1) -> None:
        self._itl.extend([dt] * n)

    @staticmethod
    def _pcts(xs: deque) -> dict:
        if not xs:
            return {"n": 0, "p50": None, "p90": None, "p99": None}
        p50, p90, p99 = np.percentile(np.fromiter(xs, float), [50, 90, 99])  # linear, numpy's default
        return {"n": len(xs), "p50": float(p50), "p90": float(p90), "p99": float(p99)}

    def summary(self) -> dict:
        """``{"ttft": {n, p50, p90, p99}, "itl": {...}, "requests": ttft_count}`` in seconds."""
        return {"ttft": self._pcts(self._ttft), "itl": self._pcts(self._itl), "requests": self.ttft_count}


def record_output(s, t_submit: float, t_last: dict, now: float, window: LatencyWindow, metrics=None) -> None:
    """Record one output delta ``s`` (a StrOut) of a call submitted at ``t_submit`` (``time.perf_counter``
    seconds), at ``now``: its TTFT when it brings the request's first tokens, else one inter-token gap per
    token since the previous delta (``t_last[rid]``, updated here); with ``metrics`` (``--enable-metrics``)
    the same into the Prometheus histograms, and the request's totals once it finishes."""
    t = s.token
    if t.new_token_ids:
        n, last = len(t.new_token_ids), t_last[s.rid]
        if last is None:
            window.ttft(now - t_submit)
            if metrics is not None:
                metrics.observe_ttft(now - t_submit)
                if n > 1:  # the rest of a first chunk (accepted drafts) came with it: no gap
                    metrics.observe_itl(0.0, n - 1)
        else:
            window.itl((now - last) / n, n)
            if metrics is not None:
                metrics.observe_itl((now - last) / n, n)
        t_last[s.rid] = now
    if t.finished_reason is not None and metrics is not None:
        reason = kind(t.finished_reason)
        metrics.observe_finish(now - t_submit, t.prompt_tokens, t.completion_tokens, t.cached_tokens, reason)
