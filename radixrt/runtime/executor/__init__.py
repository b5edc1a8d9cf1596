"""Batch in, logits out: the scheduler's :class:`ScheduledBatch` becomes a :class:`ForwardBatch`
(``ModelRunner.prepare``: ids, positions, attention metadata, logit rows, shared-prefix groups from
``cascade_groups``), and ``ModelRunner.forward`` runs the model over the paged KV pool (or replays a CUDA
graph, ``cuda_graph_runner``). It makes no decisions. May import models, layers, mem and kernels; never
the scheduler or the server.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from radixrt.runtime.executor.forward_batch import ForwardBatch
    from radixrt.runtime.executor.model_runner import ModelRunner
    from radixrt.runtime.executor.scheduled_batch import ScheduledBatch

# Lazy (PEP 562): the server's main process reads ``memory``'s /proc readers and must not load torch.
_WHERE = {
    "ForwardBatch": "radixrt.runtime.executor.forward_batch",
    "ModelRunner": "radixrt.runtime.executor.model_runner",
    "ScheduledBatch": "radixrt.runtime.executor.scheduled_batch",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["ModelRunner", "ForwardBatch", "ScheduledBatch"]
