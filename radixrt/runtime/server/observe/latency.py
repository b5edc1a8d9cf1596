"""Recent TTFT and ITL samples (seconds), kept in the main process for ``/cache_tree`` and ``/dashboard``
(Prometheus histograms, with ``--enable-metrics``, are the long-run record)."""

from __future__ import annotations

from collections import deque

import numpy as np


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
