"""A :class:`LlamaForCausalLM` on the CPU over modules and tensors built by a loader (``gguf_load``,
``st_load``), without allocating the dense layers it replaces (the model is made on the meta device)."""
from __future__ import annotations

import torch
from torch import nn

from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.llama import LlamaForCausalLM
from radixrt.runtime.models.rope import Rotary


def assemble(parts: dict, margs: ModelArgs, where: str, max_pos: int | None = None) -> LlamaForCausalLM:
    """``parts``: module or tensor by its name in :class:`LlamaForCausalLM` (shared, read-only); the model's
    own layers hold them. Rotary tables for ``max_pos`` positions (default the architecture's).

    Raises:
        ValueError: a parameter has no value in ``parts`` (the message names ``where`` and the parameter).
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(margs)
    for name, value in parts.items():
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        if isinstance(value, nn.Module):
            setattr(owner, attr, value)
        else:
            setattr(owner, attr, nn.Parameter(value, requires_grad=False))
    model.rotary = Rotary(margs.inv_freq, max_pos or margs.max_position_embeddings, margs.rope_scaling)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"{where}: no tensor for {left[:4]}")
    return model.eval()
