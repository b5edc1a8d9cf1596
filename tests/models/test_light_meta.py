"""A GGUF's config, rope and EOS id without transformers (models/light_meta.py), and the deferred tokenizer:
the same values as transformers gives, checked exactly; and a scheduler built for the server imports no
transformers before it is ready."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from radixrt.runtime.models.args import ModelArgs
from radixrt.runtime.models.light_meta import DeferredTokenizer, JsonConfig, eos_token_id, light_config
from radixrt.runtime.models.loader import (
    _converted,
    default_gguf_path,
    deferred_tokenizer,
    load_config,
    load_model_config,
    load_tokenizer,
)
from radixrt.runtime.models.rope import inv_freq

LLAMA_1B = dict(
    model_type="llama",
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
)


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
        },  # no original_max_position_embeddings: the config's maximum, as transformers
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "default", "rope_theta": 100000.0},
    ],
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_own_rope_is_transformers_bit_for_bit(rope, head_dim):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = dict(LLAMA_1B, head_dim=head_dim, rope_parameters=dict(rope))
    ours, scaling = inv_freq(JsonConfig(d), head_dim)
    hf = LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})
    fn = ROPE_INIT_FUNCTIONS.get(rope["rope_type"])
    want = (
        fn(hf, torch.device("cpu"))[0]
        if fn
        else 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    )
    assert ours.dtype == torch.float32 and ours.shape == (head_dim // 2,) and scaling == 1.0
    assert torch.equal(ours, want.float())


def test_gguf_config_and_eos_without_transformers_equal_transformers():
    path = default_gguf_path()
    _, cache = _converted(path)
    light, hf = load_model_config(path), load_config(path)
    assert isinstance(light, JsonConfig) and not isinstance(hf, JsonConfig)
    a, b = ModelArgs.from_hf(light), ModelArgs.from_hf(hf)
    assert {k: v for k, v in vars(a).items() if k != "inv_freq"} == {
        k: v for k, v in vars(b).items() if k != "inv_freq"
    }
    assert torch.equal(a.inv_freq, b.inv_freq)
    assert light.eos_token_id == hf.eos_token_id == 2
    tok = load_tokenizer(path)
    assert eos_token_id(cache) == tok.eos_token_id == 2
    code = (
        "import sys\nfrom radixrt.runtime.models.loader import load_model_config, deferred_tokenizer\n"
        "from radixrt.runtime.models.args import ModelArgs\n"
        f"a = ModelArgs.from_hf(load_model_config({path!r}))\nt = deferred_tokenizer({path!r})\n"
        "print(a.vocab_size, a.num_layers, t.eos_token_id, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["49152", "30", "2", "False"]


def test_gguf_model_builds_without_transformers_or_dynamo():
    """The server's scheduler path (config, EOS id, weights, the meta-device model they fill) imports neither
    transformers nor torch._dynamo (meta-device init ran torch's Python references, which import it)."""
    path = default_gguf_path()
    code = (
        "import sys\nfrom radixrt.runtime.models.loader import load_model_config, deferred_tokenizer\n"
        "from radixrt.runtime.models.args import ModelArgs\n"
        "from radixrt.runtime.models.gguf_load import build_from_gguf\n"
        f"a = ModelArgs.from_hf(load_model_config({path!r}))\ndeferred_tokenizer({path!r})\n"
        f"m = build_from_gguf({path!r}, a, 'auto', 256)\n"
        "print(m.rotary.cos.shape[0], 'transformers' in sys.modules, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["256", "False", "False"]


def test_light_config_leaves_older_writers_and_yarn_to_transformers(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "transformers_version": "4.57.1"}')
    assert light_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "transformers_version": "5.25.0", '
        '"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}'
    )
    assert light_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "transformers_version": "5.25.0", '
        '"rope_parameters": {"rope_type": "llama3", "factor": 4.0}}'
    )
    assert light_config(str(tmp_path)).rope_parameters == {"rope_type": "llama3", "factor": 4.0}


def test_deferred_tokenizer_loads_once_started_and_forwards():
    path = default_gguf_path()
    calls = []

    def load():
        calls.append(1)
        return load_tokenizer(path)

    t = DeferredTokenizer(load, 2)
    assert t.eos_token_id == 2 and calls == [] and not t.future.done()  # no load for the EOS id
    t.start()
    t.start()
    assert t.result() is load_tokenizer(path) and calls == [1]
    assert (
        t("Hello world", add_special_tokens=False)["input_ids"]
        == load_tokenizer(path)("Hello world", add_special_tokens=False)["input_ids"]
    )
    assert t.decode([2]) == "<|im_end|>"
    real = deferred_tokenizer(path)
    assert isinstance(real, DeferredTokenizer) and real.eos_token_id == 2 and not real.future.done()

    def broken():
        raise OSError("gone")

    bad = DeferredTokenizer(broken, None)
    with pytest.raises(OSError, match="^gone$"):
        bad.decode([1])  # the first use starts the load and raises its error
