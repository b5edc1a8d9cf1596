"""Counters and timing of the step loop, kept apart from the step itself so ``Scheduler.step`` reads as
verbs. Read by ``get_server_info`` (``cache``), the benchmarks and the periodic log line."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("radixrt.runtime.scheduler.scheduler")


@dataclass
class StepStats:
    steps: int = 0  # driver turns that ran Scheduler.step (batch or not)
    step_time: float = 0.0  # seconds inside Scheduler.step, summed
    forward_time: float = 0.0  # seconds of it inside ModelRunner.forward (the rest is scheduling overhead)
    req_forward_passes: int = 0  # summed over requests: one per step a request takes part in
    last_tokens: int = 0  # the last step's tokens computed (drafts included) ...
    last_time: float = 0.0  # ... and its seconds: the speculation cost model's step-time samples

    @property
    def sched_time(self) -> float:
        """Seconds of the steps spent outside the forward pass (scheduling, packing, sampling, caching)."""
        return self.step_time - self.forward_time

    def record(self, seconds: float, forward_seconds: float, batch_size: int, tokens: int) -> None:
        """Add one step of ``seconds`` (``forward_seconds`` of it in the forward) over ``batch_size`` requests
        computing ``tokens`` tokens."""
        self.steps += 1
        self.last_tokens, self.last_time = tokens, seconds
        self.step_time += seconds
        self.forward_time += forward_seconds
        self.req_forward_passes += batch_size

    def log_every(self, interval: int, sched) -> None:
        """One info line every ``interval`` steps: running, waiting, hit rate, free pages."""
        if self.steps % interval == 0 and sched.query_tokens:
            logger.info(
                "step %d: running=%d waiting=%d hit_rate=%.3f free_pages=%d",
                self.steps,
                len(sched.running),
                len(sched.waiting),
                sched.hit_tokens / sched.query_tokens,
                sched.allocator.num_free,
            )
