"""At ``--quantization auto`` a GGUF block tensor used as stored is a read-only view of the file's memory map
(no copy: gguf_load's module doc); stacked parts are our own copy. Checked exactly: the bytes against
``gguf.GGUFReader``'s tensors of the SmolLM2 file, and where they live from ``/proc/self/maps``."""
from __future__ import annotations

import os

import numpy as np

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
                return (parts[5], addr - lo + int(parts[2], 16)) if len(parts) > 5 and parts[5].startswith("/") \
                    else None
    raise AssertionError(f"address {addr:#x} is not mapped")


def test_stored_blocks_are_views_of_the_map_and_stacked_parts_are_copies():
    import gguf

    path = default_gguf_path()
    raw = {t.name: t for t in gguf.GGUFReader(path).tensors}
    out = _load(path, ModelArgs.from_hf(load_config(path)), "auto")
    real = os.path.realpath(path)
    for module, name in (("layers.0.mlp.down_proj", "blk.0.ffn_down.weight"),
                         ("layers.3.self_attn.o_proj", "blk.3.attn_output.weight"),
                         ("embed_tokens", "token_embd.weight")):
        blocks = out[module].blocks
        assert blocks.numpy().tobytes() == np.asarray(raw[name].data).tobytes(), module
        assert _file_offset(blocks.data_ptr()) == (real, int(raw[name].data_offset)), module
    gate_up = out["layers.0.mlp.gate_up_proj"].blocks
    want = np.concatenate([np.asarray(raw[f"blk.0.ffn_{p}.weight"].data) for p in ("gate", "up")])
    assert gate_up.numpy().tobytes() == want.tobytes()
    assert _file_offset(gate_up.data_ptr()) is None  # our own (anonymous) memory
