"""The x16 layouts (``x16_layout.h``): a GGUF block weight repacked once, at load, with 16 output rows side by
side 4 bytes at a time, so that a product of T activation rows (a decode batch, speculation's verify rows, a
prefill chunk) reads and unpacks each weight byte once for all T rows and multiplies with one ``vpdpbusd``
per 64 multiply-adds (``x16_512.h``; ``maddubs`` + ``madd`` on AVX2, ``x16_avx2.h``).

Types: :data:`LAYOUTS` (Q4_K, Q5_K, Q6_K, Q8_0 and the legacy 32-element Q4_0, Q4_1, Q5_0, Q5_1). A weight
``[N, K]`` (``N`` a multiple of 16) in GGUF blocks ``[N, K / QK * type_size]`` uint8 becomes ``[N / 16, K / QK *
BYTES]`` uint8; ``torch.ops.radixrt_ggml.mm(x, w, ggml_type | X16)`` multiplies it. The arithmetic, the same
bits on every path and every row count, is ``x16_layout.h``'s; :func:`mm_twin` is its torch twin (int64 sums, fp32
products, and each fma rounded once, emulated exactly in float64), which the tests hold the C++ tiles to bit for
bit. The legacy types' fold: ``S = sum q y - Z Y`` (Z = 8 for Q4_0, 16 for Q5_0, 0 for Q4_1 / Q5_1; Y the
activation block's sum), ``acc = fma(S, d dy, acc)``, then for Q4_1 / Q5_1 ``acc = fma(Y, m dy, acc)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from radixrt.kernels import quant as kq
from radixrt.kernels.hugepage import huge_empty

X16 = 256  # ggml type | X16: the weight is in that type's x16 layout


class Layout(NamedTuple):
    """Elements per block (``qk``), bytes of one GGUF block, bytes of one x16 block (16 rows)."""

    qk: int
    gguf: int
    bytes: int


LAYOUTS: dict[str, Layout] = {
    "Q4_K": Layout(256, 144, 2368),
    "Q5_K": Layout(256, 176, 2880),
    "Q6_K": Layout(256, 210, 3360),
    "Q8_0": Layout(32, 34, 544),
    "Q4_0": Layout(32, 18, 288),
    "Q4_1": Layout(32, 20, 320),
    "Q5_0": Layout(32, 22, 352),
    "Q5_1": Layout(32, 24, 384),
}
# the legacy types: (zero point Z, a minimum m, a fifth bit); x16_layout.h's Legacy32
LEGACY: dict[str, tuple[int, bool, bool]] = {
    "Q4_0": (8, False, False),
    "Q4_1": (0, True, False),
    "Q5_0": (16, False, True),
    "Q5_1": (0, True, True),
}
_T4 = np.arange(4)


def can_repack(type_name: str, rows: int) -> bool:
    """True if a ``[rows, K]`` weight of ``type_name`` has an x16 layout (a listed type, rows % 16 == 0)."""
    return type_name in LAYOUTS and rows > 0 and rows % 16 == 0


def repack(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """GGUF blocks ``[N, K / qk * gguf]`` uint8 -> the x16 layout ``[N / 16, K / qk * bytes]`` uint8 (C++ where
    the kernels load, else :func:`repack_np`). Raises ValueError: a type without a layout, N not a multiple
    of 16, or a row that is not whole blocks."""
    if type_name not in LAYOUTS:
        raise ValueError(f"x16: no x16 layout for ggml type {type_name!r}; layouts: {list(LAYOUTS)}")
    lay = LAYOUTS[type_name]
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] % lay.gguf or blocks.shape[0] % 16:
        raise ValueError(
            f"x16: blocks must be uint8 [N, K / {lay.qk} * {lay.gguf}] with N a multiple of 16, "
            f"got {blocks.dtype} {list(blocks.shape)}"
        )
    ops = kq.ggml_gemv()
    if ops is None:
        return torch.from_numpy(repack_np(blocks.numpy(), type_name))
    # our own copy, read once per decode step: in huge pages (see huge_empty)
    out = torch.from_numpy(huge_empty((blocks.shape[0] // 16, blocks.shape[1] // lay.gguf * lay.bytes)))
    ops.x16_repack(blocks.contiguous(), kq.BY_NAME[type_name].ggml_type, out)
    return out


def _lanes(a: np.ndarray, axis: int) -> np.ndarray:
    """``[16 G, nb, *rest]`` -> ``[G, nb, *rest[:axis], 16, *rest[axis:]]``: the row moved into lane position."""
    g, nb = a.shape[0] // 16, a.shape[1]
    return np.moveaxis(a.reshape(g, 16, nb, *a.shape[2:]), 1, 2 + axis)


def _unlanes(a: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of :func:`_lanes`."""
    b = np.moveaxis(a, 2 + axis, 1)
    return b.reshape(b.shape[0] * 16, *b.shape[2:])


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 (ggml-quants.c) on ``[..., 12]`` packed bytes -> (scales, mins) ``[..., 8]`` uint8."""
    lo = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo[0] & 63, (lo[2] & 0xF) | ((lo[0] >> 6) << 4)], -1)
    mn = np.concatenate([lo[1] & 63, (lo[2] >> 4) | ((lo[1] >> 6) << 4)], -1)
    return sc.astype(np.uint8), mn.astype(np.uint8)


def repack_np(blocks: np.ndarray, type_name: str) -> np.ndarray:
    """:func:`repack` in numpy (the layout's definition beside ``x16_layout.h``'s)."""
    lay = LAYOUTS[type_name]
    n, nb = blocks.shape[0], blocks.shape[1] // lay.gguf
    a = blocks.reshape(n, nb, lay.gguf)
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = _scale_min_k4(a[..., 4:16])
        parts = [_lanes(a[..., 0:2], 0), _lanes(a[..., 2:4], 0), _lanes(sc, 1), _lanes(mn.reshape(n, nb, 4, 2), 1)]
        if type_name == "Q5_K":
            parts.append(_lanes(a[..., 16:48].reshape(n, nb, 8, 4), 1))
        qs = a[..., 16 if type_name == "Q4_K" else 48 :]
        parts.append(_lanes(qs.reshape(n, nb, 4, 8, 4), 2))
    elif type_name == "Q6_K":
        parts = [
            _lanes(a[..., 208:210], 0),
            _lanes(a[..., 192:208].reshape(n, nb, 8, 2), 1),
            _lanes(a[..., 0:128].reshape(n, nb, 2, 2, 8, 4), 3),
            _lanes(a[..., 128:192].reshape(n, nb, 2, 8, 4), 2),
        ]
    elif type_name in LEGACY:
        _, one, five = LEGACY[type_name]
        parts = [_lanes(a[..., 0:2], 0)] + ([_lanes(a[..., 2:4], 0)] if one else [])
        if five:  # the fifth bits regrouped: bit t of byte i is element 4t + i's, bit 4 + t element 16 + 4t + i's
            at = 2 + 2 * one
            qh = np.ascontiguousarray(a[..., at : at + 4]).view("<u4")[..., 0].astype(np.int64)[..., None, None]
            i, t = _T4[:, None], _T4[None, :]
            lo, hi = (qh >> (4 * t + i)) & 1, (qh >> (16 + 4 * t + i)) & 1
            parts.append(_lanes(((lo << t) | (hi << (4 + t))).sum(-1).astype(np.uint8), 0))
        parts.append(_lanes(a[..., -16:].reshape(n, nb, 4, 4), 1))
    else:  # Q8_0
        parts = [_lanes(a[..., 0:2], 0), _lanes((a[..., 2:34] ^ 0x80).reshape(n, nb, 8, 4), 1)]
    g = n // 16
    out = np.concatenate([p.reshape(g, nb, -1) for p in parts], -1)
    assert out.shape[2] == lay.bytes
    return np.ascontiguousarray(out.reshape(g, nb * lay.bytes))


def _fp16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.float16)[..., 0].astype(np.float32)


def fields(w: torch.Tensor | np.ndarray, type_name: str) -> dict[str, np.ndarray]:
    """The x16 weight ``[N / 16, K / qk * bytes]`` read back per row: ``q [N, K / qk, qk]`` (unsigned values as
    the arithmetic uses them, the legacy types' before their zero point; Q8_0 signed), ``d [N, nb]`` fp32, and
    per type ``dmin``, ``sc`` (per sub-block / group) and ``mn`` (K-quants) or ``m`` (Q4_1, Q5_1; fp32
    ``[N, nb]``). Raises ValueError on a type without a layout."""
    if type_name not in LAYOUTS:
        raise ValueError(f"x16: no x16 layout for ggml type {type_name!r}")
    lay = LAYOUTS[type_name]
    a = np.asarray(w)
    g, nb = a.shape[0], a.shape[1] // lay.bytes
    a = a.reshape(g, nb, lay.bytes)
    if type_name in ("Q4_K", "Q5_K"):
        f = {"d": _fp16(_unlanes(a[..., 0:32].reshape(g, nb, 16, 2), 0)), "dmin": None}
        f["dmin"] = _fp16(_unlanes(a[..., 32:64].reshape(g, nb, 16, 2), 0))
        f["sc"] = _unlanes(a[..., 64:192].reshape(g, nb, 8, 16), 1).astype(np.int64)
        f["mn"] = _unlanes(a[..., 192:320].reshape(g, nb, 4, 16, 2), 1).reshape(g * 16, nb, 8).astype(np.int64)
        qs_at = 320 if type_name == "Q4_K" else 832
        qs = _unlanes(a[..., qs_at:].reshape(g, nb, 4, 8, 16, 4), 2).reshape(g * 16, nb, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], 3).reshape(g * 16, nb, 8, 32).astype(np.int64)
        if type_name == "Q5_K":
            qh = _unlanes(a[..., 320:832].reshape(g, nb, 8, 16, 4), 1).reshape(g * 16, nb, 1, 32).astype(np.int64)
            q |= ((qh >> np.arange(8).reshape(1, 1, 8, 1)) & 1) << 4
        f["q"] = q.reshape(g * 16, nb, 256)
        return f
    if type_name == "Q6_K":
        d = _fp16(_unlanes(a[..., 0:32].reshape(g, nb, 16, 2), 0))
        sc = _unlanes(a[..., 32:288].reshape(g, nb, 8, 16, 2), 1).reshape(g * 16, nb, 16).view(np.int8)
        ql = _unlanes(a[..., 288:2336].reshape(g, nb, 2, 2, 8, 16, 4), 3).reshape(g * 16, nb, 2, 2, 32)
        qh = _unlanes(a[..., 2336:3360].reshape(g, nb, 2, 8, 16, 4), 2).reshape(g * 16, nb, 2, 1, 32)
        lo = np.concatenate([ql & 0xF, ql >> 4], 3)  # k = 0, 1 (low nibbles), 2, 3 (high)
        hi = (qh >> (2 * np.arange(4).reshape(1, 1, 1, 4, 1))) & 3
        q = (lo | (hi << 4)).reshape(g * 16, nb, 256).astype(np.int64)
        return {"d": d, "sc": sc.astype(np.int64), "q": q}
    d = _fp16(_unlanes(a[..., 0:32].reshape(g, nb, 16, 2), 0))
    if type_name in LEGACY:
        _, one, five = LEGACY[type_name]
        f = {"d": d}
        if one:
            f["m"] = _fp16(_unlanes(a[..., 32:64].reshape(g, nb, 16, 2), 0))
        qs = _unlanes(a[..., lay.bytes - 256 :].reshape(g, nb, 4, 16, 4), 1).reshape(g * 16, nb, 16)
        q = np.concatenate([qs & 0xF, qs >> 4], -1).astype(np.int64)
        if five:
            at = 32 + 32 * one
            qh = _unlanes(a[..., at : at + 64].reshape(g, nb, 16, 4), 0)[..., None, :].astype(np.int64)
            t = _T4[:, None]
            q |= np.concatenate([(qh >> t) & 1, (qh >> (4 + t)) & 1], -2).reshape(g * 16, nb, 32) << 4
        f["q"] = q
        return f
    qs = _unlanes(a[..., 32:544].reshape(g, nb, 8, 16, 4), 1).reshape(g * 16, nb, 32)
    return {"d": d, "q": (qs ^ 0x80).view(np.int8).astype(np.int64)}


def dequantize(w: torch.Tensor, type_name: str) -> torch.Tensor:
    """The x16 weight -> fp32 ``[N, K]``, as ``gguf.quants.dequantize`` gives the GGUF blocks it came from."""
    f = fields(w, type_name)
    n, nb, qk = f["q"].shape
    if type_name in ("Q4_K", "Q5_K"):
        q = f["q"].reshape(n, nb, 8, 32).astype(np.float32)
        dsc = (f["d"][..., None] * f["sc"].astype(np.float32))[..., None]
        dmn = (f["dmin"][..., None] * f["mn"].astype(np.float32))[..., None]
        out = dsc * q - dmn
    elif type_name == "Q6_K":
        q = f["q"].reshape(n, nb, 16, 16).astype(np.float32) - 32
        out = (f["d"][..., None] * f["sc"].astype(np.float32))[..., None] * q
    elif type_name in LEGACY:
        z, one, _ = LEGACY[type_name]
        out = f["d"][..., None] * (f["q"] - z).astype(np.float32)
        if one:
            out = out + f["m"][..., None]
    else:
        out = f["d"][..., None] * f["q"].astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(n, nb * qk))


def quantize_act(x: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``q8_act.h`` in numpy: ``x [M, K]`` fp32 -> (int8 values as int64 ``[M, K / block, block]``, fp32 scales
    ``[M, K / block]``): d = amax / 127, q = round-half-even(x * (1 / d)), all in fp32."""
    xb = x.detach().float().reshape(x.shape[0], -1, block).numpy()
    d = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    return np.rint((xb * inv[..., None]).astype(np.float32)).astype(np.int64), d


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fp32 ``a * b + c`` rounded once (IEEE fma), for fp32 arrays: the product is exact in float64 (24 + 24
    bits); the sum is exact as ``s + e`` (TwoSum); rounding ``s`` to fp32 is right unless ``s`` falls exactly
    halfway between two fp32 values, where the sign of ``e`` picks the side."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    away = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
    tie = (s != r64) & ((r64 + away.astype(np.float64)) / 2 == s)
    # at a tie, round-to-even picked r; the exact value s + e lies past the midpoint toward `away` when e
    # points the same way as s - r, and toward r otherwise
    past = tie & (e != 0) & (np.sign(e) == np.sign(s - r64))
    return np.where(past, away, r).astype(np.float32)


def mm_twin(x: torch.Tensor, w: torch.Tensor, type_name: str) -> torch.Tensor:
    """``x [M, K]`` fp32 @ the x16 weight -> ``[M, N]`` fp32 by ``x16_layout.h``'s arithmetic, in numpy: the
    same bits as ``radixrt_ggml.mm(x, w, type | X16)`` (the tests check it). Slow: for tests and reference."""
    f = fields(w, type_name)
    qw = f["q"]  # [N, nb, qk]
    n, nb, qk = qw.shape
    m = x.shape[0]
    y, dy = quantize_act(x, qk)  # [M, nb, qk], [M, nb]
    acc = np.zeros((m, n), np.float32)
    for b in range(nb):
        yb, wb = y[:, b], qw[:, b]
        if type_name in ("Q4_K", "Q5_K"):
            dj = np.einsum("mji,nji->mnj", yb.reshape(m, 8, 32), wb.reshape(n, 8, 32))
            i_sum = (dj * f["sc"][None, :, b]).sum(-1)
            ysub = yb.reshape(m, 8, 32).sum(-1)  # Y_2j + Y_2j+1 = the sub-block's sum
            c_sum = ysub @ f["mn"][:, b].T
            pd = (f["d"][None, :, b] * dy[:, b, None]).astype(np.float32)
            pm = (f["dmin"][None, :, b] * dy[:, b, None]).astype(np.float32)
            acc = fma32(i_sum.astype(np.float32), pd, acc)
            acc = fma32(-c_sum.astype(np.float32), pm, acc)
        elif type_name == "Q6_K":
            dg = np.einsum("mgi,ngi->mng", yb.reshape(m, 16, 16), wb.reshape(n, 16, 16))
            yg = yb.reshape(m, 16, 16).sum(-1)
            i_sum = (dg * f["sc"][None, :, b]).sum(-1) - 32 * (yg @ f["sc"][:, b].T)
            acc = fma32(i_sum.astype(np.float32), (f["d"][None, :, b] * dy[:, b, None]).astype(np.float32), acc)
        elif type_name in LEGACY:  # S = sum q y - Z Y;  fma(S, d dy);  Q4_1 / Q5_1 then fma(Y, m dy)
            z, one, _ = LEGACY[type_name]
            ysum = yb.sum(-1)[:, None]
            s_sum = yb @ wb.T - z * ysum
            acc = fma32(s_sum.astype(np.float32), (f["d"][None, :, b] * dy[:, b, None]).astype(np.float32), acc)
            if one:
                acc = fma32(ysum.astype(np.float32), (f["m"][None, :, b] * dy[:, b, None]).astype(np.float32), acc)
        else:
            dsum = yb @ wb.T
            acc = fma32(dsum.astype(np.float32), (f["d"][None, :, b] * dy[:, b, None]).astype(np.float32), acc)
    return torch.from_numpy(acc)
