"""What the process's memory holds: weight bytes, KV pool bytes, peak RSS, memory still available.

Reported by ``get_server_info`` (``memory``) and ``/metrics``, and used to size the KV pool on the CPU
when ``--max-total-tokens`` is unset.
"""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where tensors are counted: the server's main process reads /proc here
    import torch
    from torch import nn


def _tensor_bytes(t: torch.Tensor) -> tuple[int, int]:
    """``(key, bytes)`` of a tensor's storage, so that views and shared buffers count once."""
    if t.is_mkldnn:  # an opaque packed copy: no storage to share
        return id(t), t.numel() * t.element_size()
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every tensor the model holds (parameters, buffers, tensor attributes and the layouts of
    :class:`~radixrt.kernels.gemv.DenseWeight`), each storage counted once."""
    import torch

    seen: dict[int, int] = {}

    def add(v) -> None:
        if isinstance(v, torch.Tensor) and not v.is_meta:
            k, n = _tensor_bytes(v)
            seen[k] = n
        elif type(v).__name__ == "DenseWeight":
            for u in vars(v).values():
                add(u)

    for m in model.modules():
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            add(t)
        for v in vars(m).values():
            add(v)
    return sum(seen.values())


def peak_rss_bytes() -> int:
    """This process's peak resident set (``getrusage``: kilobytes on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """This process's resident set now, in bytes (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def available_bytes() -> int:
    """Memory the kernel could still give this process (``MemAvailable`` of ``/proc/meminfo``), in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def process_peak_rss(pids: dict[str, int]) -> dict[str, int]:
    """Peak resident set (``VmHWM`` of ``/proc/<pid>/status``) of each named process, in bytes; a process
    that is gone counts 0. ``total`` sums them."""
    out: dict[str, int] = {}
    for name, pid in pids.items():
        out[name] = 0
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out[name] = int(line.split()[1]) * 1024
        except OSError:
            pass
    out["total"] = sum(out.values())
    return out


def peaks_agreeing(memory: dict | None, pids: dict[str, int]) -> dict[str, int]:
    """Each process's peak RSS, with the scheduler's own report and ``/proc``'s agreeing: the two are read
    at different moments and a peak only grows, so both take the later (larger) value (``memory`` is updated
    in place)."""
    peaks = process_peak_rss(pids)
    if memory and "scheduler" in peaks and "peak_rss_bytes" in memory:
        peaks["scheduler"] = memory["peak_rss_bytes"] = max(peaks["scheduler"], memory["peak_rss_bytes"])
        peaks["total"] = sum(v for k, v in peaks.items() if k != "total")
    return peaks
