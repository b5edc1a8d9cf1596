"""Build the decoder's weights from a GGUF file, one layer at a time, in the layout each kernel runs from.

``--quantization auto`` (the default for a GGUF) keeps every projection in the file's own blocks and runs
it through the block kernel of its type for every row count (:mod:`radixrt.kernels.quant`): the same
arithmetic whether a row runs alone or among hundreds, and no fp32 copy. ``none`` dequantizes each
projection to fp32 (a layer's transient copy at a time, never the whole model), for HF parity; ``fp16``,
``int8``, ``q4`` and ``q4_k`` re-quantize from that fp32 copy (one projection at a time; a file's own
Q8_0 / Q4_0 / Q4_1 / Q4_K blocks are kept where they are the format's) (:mod:`radixrt.runtime.layers.quant`).

At ``auto`` a block tensor of a type with an x16 layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; rows
a multiple of 16) is repacked once into it (:class:`~radixrt.runtime.layers.ggml_linear.GGMLLinear`; our own
copy, so that a step of many rows streams the weight once); any other block tensor used as stored (rows not a
multiple of 16, ``RADIXRT_GGML_X16=0``, the embedding) is a read-only view of the file's memory map, as
llama.cpp runs: no copy. Measured on this host (a VM), every first touch of fresh anonymous memory costs ~8 us
per 4 KiB page (0.5 GB/s), so copying the 4.9 GB of an 8B Q4_K_M took ~10 s of its cold start, while file
pages already in the page cache map at ~6 GB/s. Such weights count in RSS as file pages once touched, and the
kernel may evict and re-read them under memory pressure; the file must not be rewritten while it is served (the same
contract as llama.cpp's mmap). Stacked parts (``ffn_gate`` + ``ffn_up`` in one type: one kernel call),
llama's unpermuted ``attn_q`` / ``attn_k`` rows and every re-quantized format are our own copies.

Peak memory while loading: the weights built so far, plus one layer's transient copies, plus the pages of
the memory map read since the last :func:`_drop_mapped` (released after every layer; the views read them
back at first use).
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from radixrt.runtime.layers import ggml_ops as ggml
from radixrt.runtime.layers.dense_embed import PanelEmbedding, RowEmbedding
from radixrt.runtime.layers.ggml_linear import ConcatLinear, GGMLEmbedding, GGMLLinear
from radixrt.runtime.layers.quant import FORMATS, DenseLinear, make_linear
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.assemble import assemble
from radixrt.runtime.models.gguf_weights import GGUF_TYPES, NORMS, PROJECTIONS, GGUFWeights, RawTensor, huge_empty
from radixrt.runtime.models.llama import LlamaForCausalLM

if TYPE_CHECKING:  # gguf_tp imports torch.distributed: only a --tp load pays for it (cold start)
    from radixrt.runtime.layers.parallel import TPGroup
    from radixrt.runtime.models.gguf_tp import TPSlices

logger = logging.getLogger(__name__)
LOAD_FORMATS = ("auto",) + FORMATS
GATHERED = ("self_attn.o_proj", "mlp.down_proj")  # under --tp: whole input gathered, output rows split


def _drop_mapped(w: GGUFWeights) -> None:
    """Give back the mapped file pages read so far (they stay in the page cache, not in our RSS)."""
    m = getattr(getattr(w, "mapping", None), "_mmap", None)
    if m is not None and hasattr(m, "madvise"):
        m.madvise(mmap.MADV_DONTNEED)


def _bias(parts: list[RawTensor] | None) -> torch.Tensor | None:
    return None if parts is None else torch.cat([p.fp32() for p in parts])


def _native(t: RawTensor, bias: torch.Tensor | None) -> nn.Module:
    """One matrix in its own format: block types in their blocks, F32/F16/BF16 in their own dtype (the dense
    panel kernel widens 2-byte weights in registers: an F16 file stays 2 bytes per parameter)."""
    if t.type_name in ggml.SUPPORTED:  # the file's own pages, no copy (see the module doc); ours if owned
        return GGMLLinear(t.type_name, t.torch_bytes(copy=False), t.shape[1], bias)
    lin = DenseLinear(t.torch_bytes(copy=False), bias, None)  # the panels are the copy: none before them
    if lin.fp32.panels is None and not t.owned:  # no C++ library: the plain tensor is kept, so our own copy
        lin = DenseLinear(t.torch_bytes(), bias, None)
    return lin


def make_projection(weights: list[RawTensor], biases: list[RawTensor] | None, fmt: str, name: str) -> nn.Module:
    """The module of one fused projection (parts in order, ``[out_i, in]`` each) in format ``fmt``."""
    bias = _bias(biases)
    if fmt == "auto":
        kinds = {w.type_name for w in weights}
        if len(kinds) == 1:  # one tensor of the parts' rows, stacked (blocks run along the input)
            t = weights[0]
            if len(weights) > 1:
                parts = [np.asarray(w.data) for w in weights]
                data = huge_empty((sum(len(p) for p in parts),) + parts[0].shape[1:], parts[0].dtype)
                np.concatenate(parts, out=data)
                t = RawTensor(name, t.type_name, t.type_id, (data.shape[0],) + t.shape[1:], data, owned=True)
            return _native(t, bias)
        # a Q4_K_M file mixes types inside one fused module (attn_v in Q6_K beside Q4_K q and k)
        cuts = [0]
        for w in weights:
            cuts.append(cuts[-1] + w.shape[0])
        return ConcatLinear(
            [_native(w, None if bias is None else bias[cuts[i] : cuts[i + 1]]) for i, w in enumerate(weights)]
        )
    dense = torch.cat([w.fp32() for w in weights])
    blocks = None
    if len({w.type_name for w in weights}) == 1 and weights[0].type_name in ("Q4_0", "Q4_1", "Q8_0", "Q4_K"):
        blocks = (weights[0].type_name, torch.cat([w.torch_bytes(copy=False) for w in weights]))
    return make_linear(fmt, name, dense, bias, blocks)


def _vocab(w: GGUFWeights, name: str, slices: TPSlices | None) -> RawTensor:
    """The embedding or head table, or (under ``--tp``) this rank's rows of it."""
    t = w.need(name)
    return t if slices is None else slices.vocab_rows(t)


def _head(w: GGUFWeights, margs: ModelArgs, fmt: str, embedding: nn.Module, slices: TPSlices | None) -> nn.Module:
    """The LM head; a tied head in blocks reads the embedding's own bytes (one copy)."""
    blocks = isinstance(embedding, GGMLEmbedding)
    ours = fmt == "auto" or (fmt in ("int8", "q4", "q4_k") and blocks and embedding.type_name == "Q8_0")
    if margs.tie_word_embeddings and blocks and ours:
        return GGMLLinear(embedding.type_name, embedding.blocks, embedding.hidden, None)
    t = _vocab(w, "token_embd.weight" if margs.tie_word_embeddings else "output.weight", slices)
    return make_projection([t], None, fmt, "lm_head")


def _embed_and_head(
    w: GGUFWeights, margs: ModelArgs, fmt: str, slices: TPSlices | None = None
) -> tuple[nn.Module, nn.Module]:
    """``(embedding, lm_head)``. Block types stay in blocks at every format, F16/BF16/F32 in their own dtype
    (a row widens to exactly the fp32 table's values). At ``auto`` a tied dense table is held once, as the
    head's panels, and the embedding reads its rows from them. Under ``--tp`` both hold this rank's
    vocabulary rows and the embedding's lookups are summed over the ranks."""
    t = _vocab(w, "token_embd.weight", slices)
    if t.type_name in ggml.SUPPORTED:
        emb: nn.Module = GGMLEmbedding(t.type_name, t.torch_bytes(copy=False), t.shape[1])
        head = _head(w, margs, fmt, emb, slices)
    elif margs.tie_word_embeddings and fmt == "auto":
        head = _native(t, None)
        emb = PanelEmbedding(head.fp32)
    else:
        emb = RowEmbedding(t.torch_bytes())
        head = _head(w, margs, fmt, emb, slices)
    if slices is None:
        return emb, head
    from radixrt.runtime.models.gguf_tp import VocabShard

    return VocabShard(emb, *slices.vocab, slices.tp), head


_CACHE: dict = {}


def load_gguf_weights(path: str, margs: ModelArgs, fmt: str, tp: TPGroup | None = None) -> dict:
    """Every module and tensor of the decoder, by its name in :class:`LlamaForCausalLM`; under ``--tp``
    (``tp.size > 1``) this rank's slices only (:mod:`.gguf_tp`). Cached per process (the modules are
    read-only; every engine's model shares them).

    Raises:
        ValueError: ``fmt`` not in :data:`LOAD_FORMATS`; a bad file, a missing tensor, or a weight type
            without a kernel (the message names the file, the tensor and the supported types); under
            ``--tp``, head counts or an intermediate size that do not split over the ranks.
    """
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"quantization must be one of {LOAD_FORMATS}, got {fmt!r}")
    st = os.stat(path)
    slices = None
    if tp is not None and tp.size > 1:
        from radixrt.runtime.models.gguf_tp import TPSlices

        slices = TPSlices(margs, tp)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, fmt, None if slices is None else tp.rank)
    if key not in _CACHE:
        while len(_CACHE) >= 2:  # two formats of one model (a test's none and auto engines) stay loaded
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _load(path, margs, fmt, slices)
    return _CACHE[key]


def _load(path: str, margs: ModelArgs, fmt: str, slices: TPSlices | None = None) -> dict:
    w = GGUFWeights(path, margs.num_heads, margs.num_kv_heads, GGUF_TYPES)
    out: dict = {}
    # the vocabulary table first, while no layer is held: its mapped pages and its copy are the largest
    # transient of the load (a tied F16 head at 1B: 501 MiB mapped + 501 MiB of panels)
    out["embed_tokens"], out["lm_head"] = _embed_and_head(w, margs, fmt, slices)
    _drop_mapped(w)
    for i in range(margs.num_layers):
        for module in PROJECTIONS:
            weights, biases = w.projection(i, module)
            if slices is not None:
                weights, biases = slices.projection(module, weights, biases)
            lin = make_projection(weights, biases, fmt, f"layers.{i}.{module}")
            if slices is not None and module in GATHERED:
                lin = slices.gathered(module, lin)
            out[f"layers.{i}.{module}"] = lin
        for module, part in NORMS.items():
            v = w.vector(f"blk.{i}.{part}.weight")
            if v is not None:
                out[f"layers.{i}.{module}.weight"] = v
        _drop_mapped(w)
    out["norm.weight"] = w.need("output_norm.weight").fp32()
    _drop_mapped(w)
    logger.info("weights from %s: %s, %.1f MiB as stored", path, fmt, w.nbytes() / 2**20)
    return out


def build_from_gguf(
    path: str, margs: ModelArgs, fmt: str, max_pos: int | None = None, tp: TPGroup | None = None
) -> LlamaForCausalLM:
    """A :class:`LlamaForCausalLM` on the CPU over :func:`load_gguf_weights` (shared modules, own layers),
    rotary tables for ``max_pos`` positions (default the architecture's); under ``--tp`` rank ``tp.rank``'s
    shard, whose logits are gathered from every rank."""
    model = assemble(load_gguf_weights(path, margs, fmt, tp), margs, path, max_pos)
    if tp is None or tp.size == 1:
        return model
    from radixrt.runtime.models import gguf_tp

    return gguf_tp.finish(model, gguf_tp.TPSlices(margs, tp))
