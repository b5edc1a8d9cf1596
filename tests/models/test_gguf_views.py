"""At ``--quantization auto`` a GGUF block tensor used as stored is a read-only view of the file's memory map
(no copy: gguf_load's module doc); stacked parts are our own copy, and so is a projection in its x16 layout
(the SmolLM2 file's Q4_1 projections, unless ``RADIXRT_GGML_X16=0``). Checked exactly: the bytes against
``gguf.GGUFReader``'s tensors of the SmolLM2 file, and where they live from ``/proc/self/maps``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from radixrt.kernels.quant import x16
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.gguf_load import _load
from radixrt.runtime.models.loader import default_gguf_path, load_config


def _file_offset(addr: int) -> tuple[str, int] | None:
    """(mapped file, offset in it) of address ``addr`` in this process, or None for anonymous memory."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return (
                    (parts[5], addr - lo + int(parts[2], 16)) if len(parts) > 5 and parts[5].startswith("/") else None
                )
    raise AssertionError(f"address {addr:#x} is not mapped")


@pytest.mark.parametrize("x16_env", ["0", "1"])
def test_stored_blocks_are_views_of_the_map_and_stacked_parts_are_copies(monkeypatch, x16_env):
    import gguf

    monkeypatch.setenv("RADIXRT_GGML_X16", x16_env)  # "1": the projections where the x16 layout runs
    path = default_gguf_path()
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    out = _load(path, ModelArgs.from_hf(load_config(path)), "auto")
    real = os.path.realpath(path)
    for module, name in (
        ("layers.0.mlp.down_proj", "blk.0.ffn_down.weight"),
        ("layers.3.self_attn.o_proj", "blk.3.attn_output.weight"),
        ("embed_tokens", "token_embd.weight"),
    ):
        blocks, stored = out[module].blocks, np.ascontiguousarray(raw[name].data)
        if getattr(out[module], "x16", False):  # our own copy, the file's bytes rearranged
            assert x16_env == "1" and torch.equal(blocks, x16.repack(torch.from_numpy(stored), out[module].type_name))
            assert _file_offset(blocks.data_ptr()) is None, module
            continue
        assert module == "embed_tokens" or x16_env == "0", module
        assert blocks.numpy().tobytes() == stored.tobytes(), module
        assert _file_offset(blocks.data_ptr()) == (real, int(raw[name].data_offset)), module
    gate_up = out["layers.0.mlp.gate_up_proj"]
    want = np.concatenate([np.asarray(raw[f"blk.0.ffn_{p}.weight"].data) for p in ("gate", "up")])
    if gate_up.x16:
        assert torch.equal(gate_up.blocks, x16.repack(torch.from_numpy(want), gate_up.type_name))
    else:
        assert gate_up.blocks.numpy().tobytes() == want.tobytes()
    assert _file_offset(gate_up.blocks.data_ptr()) is None  # our own (anonymous) memory


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping holding ``addr`` (``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"address {addr:#x} is not mapped")


def test_copied_weights_are_advised_huge_pages():
    """Our copies of at least 2 MiB (stacked gate/up, unpermuted q/k) sit in 2 MiB-aligned anonymous memory
    advised MADV_HUGEPAGE ("hg"); a smaller one is a plain array."""
    from radixrt.runtime.models.gguf_weights import huge_empty

    a = huge_empty((3, 1 << 20), np.uint8)
    a[:] = 7
    assert a.shape == (3, 1 << 20) and a.flags.c_contiguous and a.ctypes.data % (2 << 20) == 0
    assert "hg" in _vm_flags(a.ctypes.data) and _file_offset(a.ctypes.data) is None
    # a small one is np.empty's own buffer (malloc's heap; whose flags other allocations of the process
    # can change, so they are not checked here), not a view of a mapping
    small = huge_empty((1000,), np.float32)
    assert small.nbytes == 4000 and small.flags.owndata and not a.flags.owndata
