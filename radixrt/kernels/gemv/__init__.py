"""Dense CPU products ``x @ w.T`` of a projection: one copy of the weight, in its own dtype, for every row count.

The C++ op (``dense_gemm.cpp``, built by :mod:`radixrt.kernels.cpp`)::

    torch.ops.radixrt_gemv.gemv(Tensor x, Tensor w_p) -> Tensor

takes ``x [M, K]`` fp32 contiguous, any ``M >= 0``, and ``w_p [N * K]``: the weight ``w [N, K]`` in the panel
layout of :func:`pack_panels`, fp32, fp16 or bf16 (widened to fp32 exactly as it is read), and returns
``[M, N]`` fp32. Each output is one FMA chain in k order whatever ``M``, the row's position or the thread
count, so a row's result is the same bits alone or among 1000 rows: greedy tokens do not depend on whether
a prefix came from the cache. It raises ``RuntimeError`` ("x must be fp32 ...", "w_p must be fp32, fp16 or
bf16 ...") on other dtypes, non-contiguous inputs or a ``w_p`` whose size is not a multiple of ``K``.

Why one kernel: the earlier design ran a GEMV up to 8 rows and oneDNN's packed copy above, which kept two
fp32 copies of every weight and gave a row different bits at 8 and 9 rows. Measured (``benchmarks/
bench_dense.py``, ``benchmarks/results/dense.json``: 2 cores, one run at load average 1.5, a machine shared
with other jobs, so compare within the run): at 512 rows, against oneDNN fp32, fp32 0.61-0.94x, fp16
0.71-1.03x, bf16 0.83-1.00x on Llama-3.2-1B and SmolLM2-135M shapes; at 1 row fp32 reads 16-26 GB/s (the
``x.sum()`` probe: 16.5), and fp16 / bf16 run 1.2-2.1x fp32's products per second (1.7-2.1x on Llama's).
"""

from __future__ import annotations

import torch

from radixrt.kernels import cpp

PANEL = 32  # output columns per panel, as in dense_tile.h
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pack_panels(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` (any dtype) -> ``[N * K]`` of the same dtype: panels of :data:`PANEL` rows of ``w``
    (output columns), each stored transposed ``[K, PANEL]``, one after another; the last ``[K, N % PANEL]``
    when ``N`` is ragged."""
    n, k = w.shape
    full = n - n % PANEL
    # copied once, straight into the result: a reshape of the transposed view and a cat would hold two
    # more copies at once (the whole LM head's worth for a tied embedding, at load time)
    out = torch.empty(n * k, dtype=w.dtype, device=w.device)
    out[: full * k].view(full // PANEL, k, PANEL).copy_(w[:full].reshape(full // PANEL, PANEL, k).transpose(1, 2))
    out[full * k :].view(k, n - full).copy_(w[full:].t())
    return out


def unpack_panels(w_p: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of :func:`pack_panels`: ``[N * K]`` -> ``[N, K]``, same dtype."""
    full = n - n % PANEL
    head = w_p[: full * k].reshape(full // PANEL, k, PANEL).transpose(1, 2).reshape(full, k)
    return torch.cat([head, w_p[full * k :].reshape(k, n - full).t()])


class DenseWeight:
    """A CPU weight ``[N, K]`` held once, in fp32, fp16 or bf16, multiplied by fp32 rows.

    Args:
        weight: ``[N, K]`` fp32, fp16 or bf16 (any device; copied to the CPU).
        dtype: the dtype to hold it in (one of those three); default the weight's own. A bool here is the
            old positional ``gemv`` flag (runtime/layers/quant.py passes one) and is ignored, like ``gemv=``:
            there is one copy whatever it says.

    Attributes:
        shape: ``(N, K)``.
        dtype: the dtype held.
        panels: ``[N * K]`` in ``dtype``, the layout of :func:`pack_panels`, when the C++ library is loaded;
            else ``None``.
        w_t: ``[K, N]`` in ``dtype`` (a transposed view of the plain ``[N, K]`` copy) when it is not; else
            ``None``.
        nbytes: bytes held (``N * K * 2`` or ``* 4``).

    Raises:
        ValueError: ``weight`` is not 2-D, or ``weight`` / ``dtype`` is not fp32, fp16 or bf16.
    """

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype | bool | None = None, gemv: bool | None = None):
        if isinstance(dtype, bool):
            dtype = None
        dtype = weight.dtype if dtype is None else dtype
        if weight.dim() != 2 or weight.dtype not in DTYPES or dtype not in DTYPES:
            raise ValueError(
                f"DenseWeight: weight must be [N, K] fp32, fp16 or bf16 and dtype one of those; got "
                f"{weight.dtype} {tuple(weight.shape)}, dtype={dtype}"
            )
        w = weight.detach().to("cpu", dtype).contiguous()
        self.shape = tuple(w.shape)
        self.dtype = dtype
        if cpp.ops("radixrt_gemv") is not None:
            self.panels, self.w_t = pack_panels(w), None
        else:
            self.panels, self.w_t = None, w.t()
        self.nbytes = w.numel() * w.element_size()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [M, K]`` fp32 -> ``x @ w.T + bias`` ``[M, N]`` fp32 (``bias [N]`` fp32 or ``None``).

        Raises:
            ValueError: ``x`` is not fp32 ``[M, K]``.
        """
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"DenseWeight: x must be fp32 [M, {self.shape[1]}], got {x.dtype} {tuple(x.shape)}")
        how, w = self.kernel(x.shape[0])
        if how == "gemv":
            y = cpp.ops("radixrt_gemv").gemv(x.contiguous(), w)
        else:
            y = x @ (w if w.dtype == torch.float32 else w.float())
        return y if bias is None else y + bias

    def kernel(self, rows: int) -> tuple[str, torch.Tensor]:
        """``(how, weight)`` of a product of ``rows`` rows, for ``radixrt_layer.decode_layer``: ``"gemv"``
        with ``panels`` (any row count, any of the three dtypes: the op reads the dtype off the tensor), or,
        without the C++ library, ``"dense_t"`` with ``w_t``."""
        return ("gemv", self.panels) if self.panels is not None else ("dense_t", self.w_t)

    def dense(self) -> torch.Tensor:
        """The values ``[N, K]`` fp32 (a new tensor, or a view of ``w_t`` when that is fp32)."""
        w = unpack_panels(self.panels, *self.shape) if self.panels is not None else self.w_t.t()
        return w.float()
