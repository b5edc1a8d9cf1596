"""The dense path's layer-by-layer loader (models/dense_load.py): what CUDA, ``--dtype bfloat16`` on the CPU
and safetensors directories under ``--tp`` load.

- Every parameter equals, bit for bit, the old whole-state-dict path's (the fp32 state dict loaded, sharded,
  then cast), for SmolLM2's Q4_1 GGUF at bf16 and for random-weight families (biases, q/k norms, untied
  heads) at fp32, unsharded and on both ranks of tp=2.
- Peak memory: loading SmolLM2 at bf16 grows the process by less than the bf16 model plus two fp32
  embeddings (measured in a fresh process); the old path held the fp32 state dict and an fp32 model
  (+1304 MB there, against this bound's 620).
- A safetensors directory missing a tensor is a ValueError naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from model_dirs import make_model_dir
from radixrt.runtime.layers.parallel import TPGroup
from radixrt.runtime.layers.tp_shard import shard_model
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.dense_load import build_dense
from radixrt.runtime.models.llama import LlamaForCausalLM
from radixrt.runtime.models.loader import load_config, load_state_dict, resolve_model


def reference(model: str, dtype: torch.dtype, tp: TPGroup | None) -> dict[str, torch.Tensor]:
    """The old path: the whole fp32 state dict, loaded into an fp32 model, sharded, then cast."""
    m = LlamaForCausalLM(ModelArgs.from_hf(load_config(model)))
    m.load_hf_state_dict(load_state_dict(model))
    if tp is not None:
        shard_model(m, tp)
    return {k: v for k, v in m.to(dtype).state_dict().items() if not k.startswith("rotary")}


def streamed(model: str, dtype: torch.dtype, tp: TPGroup | None) -> dict[str, torch.Tensor]:
    src = resolve_model(model)
    m = build_dense(src.directory, src.gguf_file, ModelArgs.from_hf(load_config(model)), torch.device("cpu"), dtype, tp)
    assert not any(p.is_meta for p in m.parameters())
    return {k: v for k, v in m.state_dict().items() if not k.startswith("rotary")}


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), k


def test_gguf_bf16_equals_state_dict_path():
    model = None  # the default: SmolLM2-135M-Instruct's Q4_1 GGUF
    assert_same(streamed(model, torch.bfloat16, None), reference(model, torch.bfloat16, None))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("dense")
    return {f: str(make_model_dir(f, root / f, tokenizer, seed=3)) for f in ("llama3", "qwen2", "qwen3")}


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_families_and_tp_shards_equal_state_dict_path(family_dirs, family):
    d = family_dirs[family]
    assert_same(streamed(d, torch.float32, None), reference(d, torch.float32, None))
    for rank in (0, 1):  # sharding needs no communication: a group-less TPGroup names the rank
        tp = TPGroup(rank, 2)
        got = streamed(d, torch.float32, tp)
        assert_same(got, reference(d, torch.float32, tp))
        assert got["layers.0.self_attn.qkv_proj.weight"].shape == (2 * 16 + 2 * 16, 64)  # 2 of 4 q, 1 of 2 kv


def test_missing_tensor_names_it(family_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    src = family_dirs["llama3"]
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            os.symlink(os.path.join(src, f), tmp_path / f)
    sd = load_file(os.path.join(src, "model.safetensors"))
    del sd["model.layers.1.mlp.down_proj.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    src_t = resolve_model(str(tmp_path))
    with pytest.raises(ValueError, match=r"missing model\.layers\.1\.mlp\.down_proj\.weight"):
        build_dense(
            src_t.directory, None, ModelArgs.from_hf(load_config(str(tmp_path))), torch.device("cpu"), torch.bfloat16
        )


PEAK = """
import json, torch
from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.dense_load import build_dense
from radixrt.runtime.models.loader import load_config, resolve_model
def status(key):  # this process's own figures (getrusage's peak may be the forking parent's)
    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024
src, a = resolve_model(None), ModelArgs.from_hf(load_config(None))
base = status('VmRSS')
m = build_dense(src.directory, src.gguf_file, a, torch.device('cpu'), torch.bfloat16)
print(json.dumps({'base': base, 'peak': status('VmHWM'), 'weights': sum(p.numel() * 2 for p in m.parameters()),
                  'embed_fp32': m.embed_tokens.weight.numel() * 4}))
"""


def test_peak_memory_is_the_model_plus_one_fp32_tensor():
    out = subprocess.run(
        [sys.executable, "-c", PEAK],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    grown = r["peak"] - r["base"]
    # the bf16 model (270 MB), the fp32 embedding while cast, the mapped file's pages read and the GGUF's
    # parsed metadata (~160 MB): measured +544 MB
    assert grown < r["weights"] + 2 * r["embed_fp32"] + 150 * 2**20, r
