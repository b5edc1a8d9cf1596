"""Build the decoder from a Hugging Face safetensors directory, tensor by tensor, layer by layer.

Each layer's tensors are read through safetensors' memory-mapped ``safe_open`` (the files of that layer
opened, read, closed: the mapped pages leave our RSS with them), put into the format and dropped before
the next layer. No whole-model state dict exists at any moment, and nothing is widened to fp32 unless the
format is fp32:

- ``auto``: the file's own dtype: an fp16 or bf16 directory stays 2 bytes per parameter (the dense panel
  kernel widens in registers), an fp32 one stays fp32;
- ``none``: fp32 (exact widening of a 2-byte file: HF fp32 parity); ``fp16`` / ``bf16``: that dtype;
- ``int8`` / ``q4`` / ``q4_k``: quantized from the file's values one projection at a time
  (:func:`radixrt.runtime.layers.quant.make_linear`); the embedding in Q8_0 blocks, a tied head reading
  the same bytes.

A tied head in a dense format holds the table once, as the head's panels; the embedding reads its rows
from them (:class:`~radixrt.runtime.layers.dense_embed.PanelEmbedding`). Norms and biases are fp32.
Peak memory while loading: the weights built so far plus one layer's tensors as stored and their
transient copies.
"""

from __future__ import annotations

import json
import logging
import os

import torch
from torch import nn

from radixrt.runtime.layers.dense_embed import PanelEmbedding, RowEmbedding
from radixrt.runtime.layers.ggml_linear import GGMLEmbedding, GGMLLinear
from radixrt.runtime.layers.quant import DTYPES, DenseLinear, FORMATS, make_linear, quantize_q8_0
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.assemble import assemble
from radixrt.runtime.models.gguf_weights import HF_NAMES, NORMS, PROJECTIONS
from radixrt.runtime.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)
LOAD_FORMATS = ("auto",) + FORMATS
_OWN = {torch.float32: "none", torch.float16: "fp16", torch.bfloat16: "bf16"}


class SafetensorsDir:
    """The tensors of a directory's ``*.safetensors`` files by transformers' names, read on demand.

    Raises (at construction):
        ValueError: no ``.safetensors`` file, or a file safetensors cannot parse (named).
    """

    def __init__(self, directory: str):
        from safetensors import safe_open

        self.directory = directory
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
        if not files:
            raise ValueError(f"{directory} holds no .safetensors weights")
        self.where: dict[str, str] = {}
        self.dtypes: dict[str, str] = {}
        for f in files:
            path = os.path.join(directory, f)
            try:
                with safe_open(path, framework="pt") as h:
                    for k in h.keys():
                        self.where[k] = path
            except Exception as e:  # noqa: BLE001 - a bad file: say which, not the reader's trace
                raise ValueError(
                    f"{path}: not a readable safetensors file ({type(e).__name__}: {str(e)[:200]})"
                ) from None
            self.dtypes.update(_header_dtypes(path))

    def dtype(self) -> torch.dtype:
        """The dtype of the projections (fp32, fp16 or bf16; the most common over every 2-D tensor)."""
        names = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
        kinds = [names.get(d) for d in self.dtypes.values()]
        kinds = [k for k in kinds if k is not None]
        return max(set(kinds), key=kinds.count) if kinds else torch.float32

    def read(self, names: list[str]) -> dict[str, torch.Tensor | None]:
        """The tensors ``names`` as stored (a missing name maps to None), each file opened once. They are views
        of safetensors' memory map (pages read on first touch, gone with the tensor): a caller that keeps one
        as is takes a copy (``copy=True``), every format built from them copies anyway (panels, blocks)."""
        from safetensors import safe_open

        out: dict[str, torch.Tensor | None] = {n: None for n in names}
        by_file: dict[str, list[str]] = {}
        for n in names:
            if n in self.where:
                by_file.setdefault(self.where[n], []).append(n)
        for path, ns in by_file.items():
            with safe_open(path, framework="pt") as h:
                for n in ns:
                    out[n] = h.get_tensor(n)  # no clone: a copy here doubled each layer's transient bytes
        return out


def _header_dtypes(path: str) -> dict[str, str]:
    """``{name: dtype}`` of a safetensors file's 2-D tensors, from its JSON header alone."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__" and len(v.get("shape", ())) == 2}


def _need(sd: dict, name: str, where: str) -> torch.Tensor:
    t = sd.get(name)
    if t is None:
        raise ValueError(f"{where}: tensor {name} is missing")
    return t


def _projection(sd: dict, hf_names: list[str], fmt: str, name: str, where: str) -> nn.Module:
    w = torch.cat([_need(sd, f"{n}.weight", where) for n in hf_names])
    biases = [sd.get(f"{n}.bias") for n in hf_names]
    bias = (
        None if all(b is None for b in biases) else torch.cat([_need(sd, f"{n}.bias", where).float() for n in hf_names])
    )
    if fmt in DTYPES:
        return DenseLinear(w, bias, DTYPES[fmt])
    return make_linear(fmt, name, w, bias, None)


def _embed_and_head(table: torch.Tensor, head: torch.Tensor | None, fmt: str) -> tuple[nn.Module, nn.Module]:
    """``(embedding, lm_head)``; ``head`` None when tied (the head then reads the embedding's bytes)."""
    if fmt in DTYPES:
        if head is None:
            lm = DenseLinear(table, None, DTYPES[fmt])
            return PanelEmbedding(lm.fp32), lm
        return RowEmbedding(table.to(DTYPES[fmt], copy=True)), DenseLinear(head, None, DTYPES[fmt])
    hidden = table.shape[1]
    if hidden % 32:
        emb = RowEmbedding(table.clone())
    else:
        emb = GGMLEmbedding("Q8_0", quantize_q8_0(table), hidden)
    if head is None and isinstance(emb, GGMLEmbedding):
        return emb, GGMLLinear("Q8_0", emb.blocks, hidden, None)
    return emb, make_linear(fmt, "lm_head", table if head is None else head, None, None)


def load_safetensors_weights(directory: str, margs: ModelArgs, fmt: str) -> tuple[dict, str]:
    """``(parts, format)``: every module and tensor of the decoder by its name in :class:`LlamaForCausalLM`,
    and the format used (``auto`` resolved to ``none``/``fp16``/``bf16``).

    Raises:
        ValueError: ``fmt`` not in :data:`LOAD_FORMATS`; a missing tensor or bad file (named).
    """
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"quantization must be one of {LOAD_FORMATS}, got {fmt!r}")
    src = SafetensorsDir(directory)
    if fmt == "auto":
        fmt = _OWN[src.dtype()]
    out: dict = {}
    # the vocabulary table first, while no layer is held: its mapped pages and its copy (panels or blocks)
    # are the largest transient of the load (a tied bf16 table at Llama-3.2-1B's shape: 501 MiB each)
    sd = src.read(["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"])
    head = None if margs.tie_word_embeddings else _need(sd, "lm_head.weight", directory)
    out["embed_tokens"], out["lm_head"] = _embed_and_head(_need(sd, "model.embed_tokens.weight", directory), head, fmt)
    out["norm.weight"] = _need(sd, "model.norm.weight", directory).to(torch.float32, copy=True)
    del sd, head
    for i in range(margs.num_layers):
        p = f"model.layers.{i}."
        names = [p + f"{hf}.{kind}" for hf in HF_NAMES.values() for kind in ("weight", "bias")]
        sd = src.read(names)
        for module, parts in PROJECTIONS.items():
            hf = [p + HF_NAMES[part] for part in parts]
            out[f"layers.{i}.{module}"] = _projection(sd, hf, fmt, f"layers.{i}.{module}", directory)
        for module in NORMS:
            v = sd.get(p + f"{module}.weight")
            if v is not None:
                out[f"layers.{i}.{module}.weight"] = v.to(torch.float32, copy=True)
        del sd  # this layer's tensors as stored: gone before the next layer is read
    logger.info("weights from %s: %s, layer by layer", directory, fmt)
    return out, fmt


def build_from_safetensors(
    directory: str, margs: ModelArgs, fmt: str, max_pos: int | None = None
) -> tuple[LlamaForCausalLM, str]:
    """``(model, format used)``: a :class:`LlamaForCausalLM` on the CPU over :func:`load_safetensors_weights`,
    rotary tables for ``max_pos`` positions (default the architecture's)."""
    parts, used = load_safetensors_weights(directory, margs, fmt)
    return assemble(parts, margs, directory, max_pos), used
