"""Share of a decode step spent in the weight matmuls, from the torch profiler (issue 12, item 3).

The engine's scheduler runs in its own thread, so the profiler records every thread (``profile_all_threads``). A weight
matmul is a call of one of :data:`WEIGHT_OPS`; ``aten::mm`` and ``aten::addmm`` (also under ``F.linear``) count only
when their right operand has the shape of one of the model's weights (so an attention product never counts). The share
is their inclusive time over the wall time of the profiled ``generate`` call (one short prefill, then decode), so
everything else (small ops, Python, the scheduler) is the rest.
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

WEIGHT_OPS = (
    "aten::_weight_int8pack_mm",
    "aten::_weight_int4pack_mm_for_cpu",
    "radixrt_ggml::q4_1_mm",
    "radixrt_ggml::q4_1x8_mm",
    "radixrt_gemv::gemv",
    "mkldnn::_linear_pointwise",
    "radixrt_ggml::q8_0_mm",
)
DENSE_OPS = ("aten::mm", "aten::addmm")


def weight_shapes(model: torch.nn.Module) -> set[tuple[int, ...]]:
    """Shapes a weight operand can have: ``[out, in]`` and ``[in, out]`` of every 2-D tensor of ``model``."""
    shapes = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if t.dim() == 2:
            shapes.update({tuple(t.shape), tuple(t.shape[::-1])})
    return shapes


def matmul_share(engine, input_ids: list[int], new_tokens: int) -> dict:
    """Profile one greedy request; returns ``{"share", "matmul_ms", "wall_ms", "steps"}`` (ms per step)."""
    from torch._C._profiler import _ExperimentalConfig

    shapes = weight_shapes(engine.runner.model)
    sp = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    ) as prof:
        t = time.perf_counter()
        engine.generate(input_ids=input_ids, sampling_params=sp)
        wall = time.perf_counter() - t
    mm_us = 0.0
    for e in prof.events():
        # inclusive times: none of these ops nests inside another one counted here
        if e.name in WEIGHT_OPS or (e.name in DENSE_OPS and tuple(e.input_shapes[-1]) in shapes):
            mm_us += e.cpu_time_total
    return {
        "share": mm_us / 1e6 / wall,
        "matmul_ms": mm_us / 1e3 / new_tokens,
        "wall_ms": wall * 1e3 / new_tokens,
        "steps": new_tokens,
    }
