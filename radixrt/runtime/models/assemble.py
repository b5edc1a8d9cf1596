"""A :class:`LlamaForCausalLM` on the CPU over modules and tensors built by a loader (``gguf_load``,
``st_load``), without allocating the dense layers it replaces (the model is made on the meta device)."""

from __future__ import annotations

import contextlib

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
    with torch.device("meta"), no_init():
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


@contextlib.contextmanager
def no_init():
    """``torch.nn.init``'s in-place initializers as no-ops (what transformers' ``no_init_weights`` does): a
    module made on the meta device holds no values to initialize, and ``normal_`` on a meta tensor runs
    torch's Python reference, whose first call imports ``torch._dynamo`` (~1.7 s of a cold start)."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_") and callable(getattr(nn.init, n))]
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, _keep)
        yield
    finally:
        for n, f in saved.items():
            setattr(nn.init, n, f)


def _keep(tensor, *args, **kwargs):
    return tensor
