"""The control half of a step: decide who runs, then conclude what the forward produced.

Owns the request queues and every :class:`~.request.Req` (``scheduler``, ``schedule_policy``), agent
sessions (``session``), the output side of a step (``output_processor``: sampling call, finish and stop
checks; ``jump_forward``), the request log, and the loops that drive it: ``process`` (the scheduler
process of ``radixrt serve``) and ``tp_lockstep`` (its ``--tp`` twin). ``build`` assembles a scheduler
for the Engine and the process alike. It builds no tensors. May import executor, tokenizer, models,
sampling, layers, mem, constrained, kernels and the loose runtime modules; never the server.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from radixrt.runtime.scheduler.build import build_scheduler
    from radixrt.runtime.scheduler.request import Req
    from radixrt.runtime.scheduler.scheduler import Scheduler

# Lazy (PEP 562): the server's main process reads ``server_info`` and must not load torch.
_WHERE = {
    "build_scheduler": "radixrt.runtime.scheduler.build",
    "Req": "radixrt.runtime.scheduler.request",
    "Scheduler": "radixrt.runtime.scheduler.scheduler",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["Scheduler", "Req", "build_scheduler"]
