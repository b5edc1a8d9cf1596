"""Peak RSS and weight bytes of loading a safetensors directory layer by layer (issue 26), per format.

Builds a random-weight Llama directory straight with safetensors (no transformers model in memory:
tensor by tensor, in the asked dtype), then loads it in a fresh process per format with ``ModelRunner``
(through ``Engine``) and reports ``ru_maxrss``, the weight bytes held, the file size and the load seconds.
The claim checked: peak RSS <= the weights held + one layer's transient copies + the interpreter/torch
baseline (measured here as the RSS before loading). Run: ``python benchmarks/load_memory.py [--layers 8
--hidden 2048 --dtype bf16 --formats auto,int8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def build(path: str, layers: int, hidden: int, inter: int, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer()
    heads, kv = hidden // 64, max(hidden // 256, 1)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        dtype={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype],
    )
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    tok.save_pretrained(path)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(dt)

    sd = {"model.embed_tokens.weight": r(len(tok), hidden), "model.norm.weight": torch.ones(hidden, dtype=dt)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update(
            {
                p + "self_attn.q_proj.weight": r(hidden, hidden),
                p + "self_attn.k_proj.weight": r(kv * 64, hidden),
                p + "self_attn.v_proj.weight": r(kv * 64, hidden),
                p + "self_attn.o_proj.weight": r(hidden, hidden),
                p + "mlp.gate_proj.weight": r(inter, hidden),
                p + "mlp.up_proj.weight": r(inter, hidden),
                p + "mlp.down_proj.weight": r(hidden, inter),
                p + "input_layernorm.weight": torch.ones(hidden, dtype=dt),
                p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dt),
            }
        )
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def measure(path: str, fmt: str) -> dict:
    """In this process (a fresh one per format): load, then report."""
    from radixrt.runtime.executor import memory

    before = memory.rss_bytes()
    t = time.time()
    from radixrt.runtime.config import ServerArgs
    from radixrt.runtime.executor.model_runner import ModelRunner

    r = ModelRunner(ServerArgs(model=path, quantization=fmt, max_total_tokens=256, device="cpu"))
    return {
        "format": fmt,
        "used": r.quantization,
        "load_s": round(time.time() - t, 1),
        "file_bytes": os.path.getsize(os.path.join(path, "model.safetensors")),
        "weight_bytes": r.memory_stats()["weight_bytes"],
        "rss_before_load": before,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--formats", default="auto,int8")
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(*a.measure)))
        return
    with tempfile.TemporaryDirectory() as d:
        build(d, a.layers, a.hidden, a.inter, a.dtype)
        for fmt in a.formats.split(","):
            out = subprocess.run([sys.executable, __file__, "--measure", d, fmt], capture_output=True, text=True)
            row = (
                json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-500:]}
            )
            mib = {k: round(v / 2**20) for k, v in row.items() if k.endswith(("bytes", "rss", "load"))}
            print(json.dumps({**row, **{k + "_mib": v for k, v in mib.items()}}), flush=True)


if __name__ == "__main__":
    main()
