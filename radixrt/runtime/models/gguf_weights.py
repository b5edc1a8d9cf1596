"""A GGUF file's weights read straight from its memory map, tensor by tensor, by the decoder's names.

Nothing passes through a whole-model fp32 state dict: :meth:`GGUFWeights.projection` hands one module's
parts (q, k, v of ``qkv_proj``; gate, up of ``gate_up_proj``) as the file's own bytes, and the caller
decides the layout (the file's blocks for their kernel, or fp32 for ``--quantization none``, one layer's
transient copy at a time). llama.cpp's converter permutes the q and k rows of the ``llama`` architecture
for its rotary layout (``convert_hf_to_gguf.py``: ``LlamaModel.permute``); rows are undone here, which
moves whole rows of blocks and so is exact for every block type.

Tensor names (llama.cpp ``gguf-py/gguf/constants.py``): ``token_embd``, ``output_norm``, ``output``,
``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down,
attn_q_norm, attn_k_norm}`` with ``.weight`` / ``.bias``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from radixrt.kernels.hugepage import huge_empty
from radixrt.runtime.models.gguf_header import read_header

# module of LlamaForCausalLM -> the GGUF tensors it fuses, in order
PROJECTIONS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}
NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
# transformers' names of the same tensors (models/dense_load.py reads them by these names)
HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
DENSE_TYPES = ("F32", "F16", "BF16")
# every type a GGUF weight may have here (a kernel each; the rest are refused at load, naming the tensor)
GGUF_TYPES = DENSE_TYPES + ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class RawTensor:
    """One GGUF tensor as stored: ``data`` is a read-only view of the memory map.

    Attributes:
        name: the GGUF name, e.g. ``blk.3.attn_q.weight``.
        type_name: the ggml type (``Q4_K``, ``F16``, ...); ``type_id`` its ``GGMLQuantizationType`` value.
        shape: ``(rows, cols)`` of the matrix (output channels, input features), or ``(n,)``.
        data: block types ``[rows, row_bytes]`` uint8; F32 / F16 ``[rows, cols]`` of that dtype; BF16 as stored.
        owned: ``data`` is our own array (rows reordered, parts stacked), not a view of the map: it is handed
            on without another copy.
    """

    name: str
    type_name: str
    type_id: int
    shape: tuple
    data: np.ndarray
    owned: bool = False

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def rows(self, index: np.ndarray) -> "RawTensor":
        """The same tensor with its rows in ``index`` order (a copy)."""
        return RawTensor(
            self.name,
            self.type_name,
            self.type_id,
            (len(index),) + self.shape[1:],
            np.take(self.data, index, axis=0, out=huge_empty((len(index),) + self.data.shape[1:], self.data.dtype)),
            owned=True,
        )

    def fp32(self) -> torch.Tensor:
        """The values as fp32 ``shape`` (a new tensor: ``gguf.quants.dequantize``, llama.cpp's reference)."""
        from gguf.quants import dequantize

        from gguf import GGMLQuantizationType

        if self.type_name == "F32":
            return torch.from_numpy(np.array(self.data, dtype=np.float32)).reshape(self.shape)
        out = dequantize(np.asarray(self.data), GGMLQuantizationType(self.type_id))
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(self.shape)

    def torch_bytes(self, copy: bool = True) -> torch.Tensor:
        """The stored bytes as a torch tensor: uint8 ``[rows, row_bytes]`` for block types, fp16 / bf16 / fp32
        ``[rows, cols]`` for the dense ones. A copy, unless ``owned`` (already ours) or ``copy=False`` (then
        a read-only view of the map: for a caller that copies it into its own layout at once)."""
        a = np.ascontiguousarray(self.data)
        if copy and not self.owned:
            a = a.copy()
        with warnings.catch_warnings():  # a view of the read-only map: torch warns that it is not writable
            warnings.simplefilter("ignore", UserWarning)
            if self.type_name == "BF16":
                return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).reshape(self.shape)
            return torch.from_numpy(a).reshape(self.shape if self.type_name in DENSE_TYPES else a.shape)


def unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's rotary permutation of a ``[n_head * head_dim, K]`` matrix:
    ``new[i] = old[idx[i]]``, the reshape/swap transformers applies when it dequantizes
    (``LlamaTensorProcessor._reverse_permute_weights``)."""
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n_rows)


class GGUFWeights:
    """The tensors of one GGUF file (memory-mapped; the header read by :mod:`.gguf_header`), by the decoder's
    module names.

    Raises (at construction):
        ValueError: the file is truncated or not a GGUF (the message names the file), or a weight's type is
            not in ``supported`` (the message names the tensor, its type and the supported list).
    """

    def __init__(self, path: str, num_heads: int, num_kv_heads: int, supported: tuple[str, ...]):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        header = read_header(path)  # scalars and tensor infos only (gguf_header.py): no vocabulary parse
        self.path = path
        self.mapping = np.memmap(path, mode="r")  # every tensor view reads from it
        self.arch = header.metadata.get("general.architecture", "llama")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.tensors: dict[str, RawTensor] = {}
        for info in header.tensors:
            try:
                kind = GGMLQuantizationType(info.type_id)
            except ValueError:
                raise ValueError(f"{path}: tensor {info.name} has unknown type id {info.type_id}") from None
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(info.dims))
            nbytes = n // block * size
            if info.offset + nbytes > len(self.mapping) or n % block:
                raise ValueError(
                    f"{path}: not a readable GGUF file (truncated or corrupt? tensor {info.name} runs past the end)"
                )
            shape = tuple(reversed(info.dims)) if len(info.dims) == 2 else (n,)
            if len(shape) == 2 and kind.name not in supported:
                raise ValueError(
                    f"{path}: tensor {info.name} has type {kind.name}, which radixrt does not run; "
                    f"supported: {list(supported)}"
                )
            flat = self.mapping[info.offset : info.offset + nbytes]
            if kind.name in ("F32", "F16"):  # as GGUFReader lays them out: items for these, bytes for the rest
                data = flat.view(np.float32 if kind.name == "F32" else np.float16).reshape(shape)
            else:
                data = flat.reshape(shape[:-1] + (shape[-1] // block * size,))
            self.tensors[info.name] = RawTensor(info.name, kind.name, int(kind), shape, data)

    def get(self, name: str) -> RawTensor | None:
        """The tensor ``name`` (rows of llama's q/k already unpermuted), or None."""
        t = self.tensors.get(name)
        if t is None or self.arch != "llama":
            return t
        part = name.split(".")[-2] if name.startswith("blk.") else ""
        if part in ("attn_q", "attn_k") and len(t.shape) == 2:
            return t.rows(unpermute_rows(t.shape[0], self.num_heads if part == "attn_q" else self.num_kv_heads))
        return t

    def need(self, name: str) -> RawTensor:
        """:meth:`get`, raising ValueError naming the file and the missing tensor."""
        t = self.get(name)
        if t is None:
            raise ValueError(f"{self.path}: tensor {name} is missing")
        return t

    def projection(self, layer: int, module: str) -> tuple[list[RawTensor], list[RawTensor] | None]:
        """``(weights, biases)`` of one fused projection of ``layer``: one RawTensor per part, in fused order;
        ``biases`` None when the parts have none."""
        parts = PROJECTIONS[module]
        weights = [self.need(f"blk.{layer}.{p}.weight") for p in parts]
        biases = [self.get(f"blk.{layer}.{p}.bias") for p in parts]
        if all(b is None for b in biases):
            return weights, None
        if any(b is None for b in biases):
            raise ValueError(f"{self.path}: layer {layer} {module}: some parts have a bias and some not")
        return weights, biases

    def vector(self, name: str) -> torch.Tensor | None:
        """A norm weight or bias as fp32 ``[n]``, or None when the file has no such tensor."""
        t = self.get(name)
        return None if t is None else t.fp32()

    def nbytes(self) -> int:
        """Bytes of every tensor as stored (about the file's size)."""
        return sum(t.nbytes for t in self.tensors.values())

    def hf_state_dict(self, num_layers: int, tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
        """Every tensor dequantized to fp32 under transformers' names: what the CUDA path loads (it moves a
        dense model). The CPU paths (``--tp`` included: :mod:`.gguf_tp`) never build it."""
        sd: dict[str, torch.Tensor] = {}
        for i in range(num_layers):
            for part, hf in HF_NAMES.items():
                for kind in ("weight", "bias"):
                    t = self.get(f"blk.{i}.{part}.{kind}")
                    if t is not None:
                        sd[f"model.layers.{i}.{hf}.{kind}"] = t.fp32()
        sd["model.embed_tokens.weight"] = self.need("token_embd.weight").fp32()
        sd["model.norm.weight"] = self.need("output_norm.weight").fp32()
        if not tie_word_embeddings:
            sd["lm_head.weight"] = self.need("output.weight").fp32()
        return sd


@lru_cache(maxsize=2)
def open_gguf(path: str, num_heads: int, num_kv_heads: int, supported: tuple[str, ...]) -> GGUFWeights:
    """One :class:`GGUFWeights` per file and process (parsing a 128k-token vocabulary's metadata takes seconds)."""
    return GGUFWeights(path, num_heads, num_kv_heads, supported)
