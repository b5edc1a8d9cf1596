"""The dense path's loader: a ``LlamaForCausalLM`` of plain ``nn.Linear`` layers in ``dtype`` on ``device``,
filled from the weight files one layer at a time.

What takes this path: CUDA (any source: a GGUF is dequantized there, bf16 by default), a bf16/fp16 model on
the CPU (``--dtype``), and a safetensors directory under ``--tp`` on the CPU. The CPU's fp32 paths load a
GGUF or safetensors file in its own format (:mod:`.gguf_load`, :mod:`.gguf_tp`, :mod:`.st_load`).

Memory (host)::

    model on the meta device (no storage)
      -> layer i: its tensors read from the file as fp32 (one layer, the transient)
                  -> fused (q/k/v, gate/up) -> this rank's slices (--tp) -> dtype, on the device
      -> embedding, final norm, lm_head: the same, one tensor at a time

so the peak is the model in ``dtype`` (where the device is the CPU) plus one layer, or the vocabulary
embedding, in fp32; never a whole-model fp32 state dict (8B: 32 GB). A GGUF tensor is dequantized by
``gguf.quants`` (llama.cpp's reference), as transformers' GGUF loader does.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from radixrt.runtime.layers.parallel import TPGroup
from radixrt.runtime.layers.tp_shard import shard_layer, shard_vocab
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.assemble import no_init
from radixrt.runtime.models.gguf_weights import GGUF_TYPES, HF_NAMES, open_gguf
from radixrt.runtime.models.llama import LlamaForCausalLM, fuse_hf, hf_names
from radixrt.runtime.models.rope import Rotary

Getter = Callable[[str], torch.Tensor]  # a transformers tensor name -> its fp32 values (KeyError: none)


def build_dense(
    directory: str,
    gguf_file: str | None,
    margs: ModelArgs,
    device: torch.device,
    dtype: torch.dtype,
    tp: TPGroup | None = None,
    max_pos: int | None = None,
) -> LlamaForCausalLM:
    """The model of ``directory`` (``gguf_file`` in it, or its ``*.safetensors``) in ``dtype`` on ``device``,
    sharded for ``tp``'s rank; rotary tables for ``max_pos`` positions (default: the architecture's).

    Raises:
        ValueError: a tensor the architecture needs is missing from the files, or has another shape (the
            message names it), or a directory without weights.
    """
    get = gguf_getter(os.path.join(directory, gguf_file), margs) if gguf_file else safetensors_getter(directory)
    shard = tp is not None and tp.size > 1
    with torch.device("meta"), no_init():
        model = LlamaForCausalLM(margs)
    for i in range(margs.num_layers):
        layer = _fill(model.layers[i], fuse_hf(hf_names(margs, i), get, margs), f"layer {i}")
        if shard:
            shard_layer(layer, margs, tp)
        model.layers[i] = layer.to(device=device, dtype=dtype)  # the fp32 layer is freed here
    for name, values in fuse_hf(hf_names(margs, None), get, margs).items():
        owner = model.get_submodule(name.rpartition(".")[0])
        _fill(owner, {"weight": values}, name)
        owner.to(dtype=dtype)  # on the CPU until sharded: each rank moves only its rows
        del values
    if shard:
        shard_vocab(model, tp)
    model.rotary = Rotary(margs.inv_freq, max_pos or margs.max_position_embeddings, margs.rope_scaling)
    model = model.to(device=device).eval()
    model.rotary.to(device)  # tables stay fp32; cast per use
    return model


def _fill(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> nn.Module:
    """``module`` (on the meta device) holding ``state``'s tensors as its parameters (assigned, not
    copied). Raises ValueError naming ``where`` and the parameter that is left without a value or whose
    shape differs."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # a shape mismatch: torch lists every one
        raise ValueError(f"weights do not fit the model at {where}: {e}") from None
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model at {where}: missing={missing} unexpected={unexpected}")
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def gguf_getter(path: str, margs: ModelArgs) -> Getter:
    """Transformers' names over a GGUF's tensors, each dequantized to fp32 when asked for (llama's q/k rows
    unpermuted by :class:`.GGUFWeights`). Raises ValueError for a file that does not parse or a type radixrt
    does not read (the message names the tensor)."""
    w = open_gguf(path, margs.num_heads, margs.num_kv_heads, GGUF_TYPES)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    to_part = {hf: part for part, hf in HF_NAMES.items()}

    def get(name: str) -> torch.Tensor:
        gname = names.get(name)
        if gname is None and name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            module, _, kind = rest.rpartition(".")
            gname = f"blk.{i}.{to_part.get(module, module)}.{kind}"
        t = w.get(gname) if gname else None
        if t is None:
            raise KeyError(f"{name} (GGUF tensor {gname} in {path})")
        return t.fp32()

    return get


def safetensors_getter(directory: str) -> Getter:
    """Transformers' names over a directory's ``*.safetensors`` files (sharded or not), each tensor read from
    its file when asked for, as fp32. Raises ValueError for a directory without them."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{directory} holds no .safetensors weights")
    where: dict[str, str] = {}
    for f in files:
        with safe_open(os.path.join(directory, f), framework="pt") as h:
            where.update(dict.fromkeys(h.keys(), f))

    def get(name: str) -> torch.Tensor:
        f = where.get(name)
        if f is None:
            raise KeyError(name)
        with safe_open(os.path.join(directory, f), framework="pt") as h:
            return h.get_tensor(name).float()

    return get
