"""radixrt against llama.cpp on GGUF files of real model shapes (random weights).

``make``: a random-weight Hugging Face directory of the shape's real config (built with transformers on
the meta device for its parameter names and shapes, each tensor filled normal std 0.02 (norms 1.0) and
written into ~2 GB bf16 safetensors shards one at a time, so an 8B model never sits whole in memory) under
``~/.cache/radixrt/models/<shape>/hf``, the SmolLM2 tokenizer copied in (the converter pads the vocabulary
to the config's ``vocab_size`` with ``[PAD<i>]`` tokens; it recognises SmolLM2's pre-tokenizer as
``smollm``), then ``convert_hf_to_gguf.py --outtype f16`` and ``llama-quantize`` to each type. Files that
exist are kept. ``measure``: per file, radixrt in a fresh subprocess (load s, batch-1 decode tok/s over 64
new tokens after a warm-up, prefill tok/s of one 512-token prompt after ``flush_cache``, weight and KV pool
bytes, peak RSS from ``getrusage``), then ``llama-bench -t 2 -p 512 -n 64 -o json`` on the same file right
after. One line per file; ``benchmarks/results/real_models.json`` (merged by file) with the load average.
``check``: greedy ids of 4 prompts x 16 tokens, radixrt alone vs batched, and agreement with
``llama-server``'s ``/completion`` (random weights give flat logits: a fraction, not an assertion).

    python benchmarks/real_models.py make --shapes llama-3.2-1b --types Q4_K_M,Q8_0,Q4_0
    flock /tmp/bench.lock python benchmarks/real_models.py measure --shapes llama-3.2-1b --types Q4_K_M,Q8_0
    python benchmarks/real_models.py check --shapes llama-3.2-1b --types Q4_K_M

Shapes: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen2.5-1.5b. Types: F16 and any llama-quantize type.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = os.path.expanduser("~/.cache/radixrt/models")
PEER = os.path.expanduser("~/.cache/radixrt/peers/llama.cpp-0.3.36")
BIN = os.path.join(PEER, "bin")
CONVERT = os.path.join(PEER, "src", "convert_hf_to_gguf.py")
OUT = os.path.join(HERE, "results", "real_models.json")
# the converter imports sentencepiece before it looks for tokenizer.model; kept out of the project's venv:
# pip install --target ~/.cache/radixrt/peers/convert-deps sentencepiece
CONVERT_DEPS = os.path.join(os.path.dirname(PEER), "convert-deps")

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}
LLAMA = dict(
    arch="llama",
    vocab_size=128256,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
)
SHAPES = {
    "llama-3.2-1b": dict(
        LLAMA,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        head_dim=64,
        tie_word_embeddings=True,
        rope_scaling=LLAMA3_ROPE,
    ),
    "llama-3.2-3b": dict(
        LLAMA,
        hidden_size=3072,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        intermediate_size=8192,
        head_dim=128,
        tie_word_embeddings=True,
        rope_scaling=LLAMA3_ROPE,
    ),
    "llama-3.1-8b": dict(
        LLAMA,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        head_dim=128,
        tie_word_embeddings=False,
        rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
    ),
    "qwen2.5-1.5b": dict(
        arch="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        hidden_act="silu",
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
}


def gguf_path(shape: str, typ: str) -> str:
    return os.path.join(MODELS, shape, f"{shape}-{typ}.gguf")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def make_hf(shape: str) -> str:
    """The random-weight bf16 safetensors directory of ``shape`` (kept if there)."""
    d = os.path.join(MODELS, shape, "hf")
    if os.path.exists(os.path.join(d, "config.json")) and any(f.endswith(".safetensors") for f in os.listdir(d)):
        return d
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer()
    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    spec.update(
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else 0,
        eos_token_id=tok.eos_token_id if tok.eos_token_id is not None else 0,
    )
    cfg = (LlamaConfig if arch == "llama" else Qwen2Config)(**spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # one tensor at a time into ~2 GB shards: an 8B model never sits whole in this box's 24 GB
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    cur, size, total, index = {}, 0, 0, {}

    def flush() -> None:
        fn = f"model-{len(set(index.values())) + 1:05d}.safetensors"
        save_file(cur, os.path.join(d, fn), metadata={"format": "pt"})
        index.update({k: fn for k in cur})
        cur.clear()

    for name, p in model.named_parameters():  # a tied head is not listed: HF omits it from the files too
        t = torch.empty(p.shape, dtype=torch.bfloat16)
        if "norm" in name:
            t.fill_(1.0)
        else:  # weights and q/k/v biases
            t.normal_(0.0, 0.02, generator=g)
        cur[name] = t
        size, total = size + t.numel() * 2, total + t.numel() * 2
        if size >= 2 << 30:
            flush()
            size = 0
    if cur:
        flush()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": index}, f)
    cfg.torch_dtype = "bfloat16"
    cfg.architectures = [type(model).__name__]  # what model.save_pretrained would record; the converter needs it
    cfg.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def make(shape: str, types: list[str]) -> None:
    f16 = gguf_path(shape, "F16")
    if not os.path.exists(f16):
        d = make_hf(shape)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([CONVERT_DEPS, os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, CONVERT, d, "--outtype", "f16", "--outfile", f16 + ".tmp"], check=True, env=env)
        os.rename(f16 + ".tmp", f16)
    for t in types:
        p = gguf_path(shape, t)
        if t != "F16" and not os.path.exists(p):
            subprocess.run([os.path.join(BIN, "llama-quantize"), f16, p + ".tmp", t, "2"], check=True)
            os.rename(p + ".tmp", p)


# ---- measure ------------------------------------------------------------------------------------------
SHORT = [1 + (i * 7919) % 40000 for i in range(16)]  # the decode prompt: 16 tokens, the same every run


def sp(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


def long_prompt(n: int) -> list[int]:
    return [1 + (i * 104729) % 40000 for i in range(n)]


def decode_tok_s(e, new_tokens: int) -> float:
    """Batch-1 decode tok/s of ``e`` after :data:`SHORT`, cold cache: the time of a ``new_tokens`` run less
    that of a 1-token run (its prefill and first token), over ``new_tokens - 1`` tokens."""
    e.flush_cache()
    t = time.perf_counter()
    e.generate(input_ids=SHORT, sampling_params=sp(1))
    first = time.perf_counter() - t
    e.flush_cache()
    t = time.perf_counter()
    out = e.generate(input_ids=SHORT, sampling_params=sp(new_tokens))
    total = time.perf_counter() - t
    assert len(out["output_ids"]) == new_tokens, out["meta_info"]
    return (new_tokens - 1) / (total - first)


def prefill_tok_s(e, ids: list[int]) -> float:
    """Prefill tok/s of ``ids`` (one 1-token generation, cold cache)."""
    e.flush_cache()
    t = time.perf_counter()
    e.generate(input_ids=ids, sampling_params=sp(1))
    return len(ids) / (time.perf_counter() - t)


def radixrt_child(path: str, prompt_len: int, new_tokens: int, kv_tokens: int) -> dict:
    """Runs in the fresh subprocess: one JSON line on stdout."""
    from radixrt import Engine
    from radixrt.kernels import cpp

    t = time.perf_counter()  # a (re)build of the C++ library is not load time: other venvs share its folder
    cpp.ops("radixrt_ggml")
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    e = Engine(
        model=path,
        quantization="auto",
        max_total_tokens=kv_tokens,
        context_length=kv_tokens,
        num_threads=2,
        log_level="warning",
        speculative_algorithm="none",
    )
    load_s = time.perf_counter() - t
    e.generate(input_ids=SHORT, sampling_params=sp(8))  # warm-up
    decode = decode_tok_s(e, new_tokens)
    long = long_prompt(prompt_len)
    e.generate(input_ids=long[:64], sampling_params=sp(1))  # warm the larger-row path
    prefill = prefill_tok_s(e, long)
    m = e.runner.memory_stats()
    e.shutdown()
    return dict(
        kernel_build_s=build_s,
        load_s=load_s,
        decode_tok_s=decode,
        prefill_tok_s=prefill,
        weight_bytes=m["weight_bytes"],
        kv_pool_bytes=m["kv_pool_bytes"],
        rss_bytes=m["rss_bytes"],
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )


def llama_bench(path: str, prompt_len: int, new_tokens: int, reps: int) -> dict:
    out = subprocess.run(
        [
            os.path.join(BIN, "llama-bench"),
            "-m",
            path,
            "-t",
            "2",
            "-p",
            str(prompt_len),
            "-n",
            str(new_tokens),
            "-r",
            str(reps),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(out.stdout)
    pp = next(r for r in rows if r["n_prompt"] == prompt_len and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] == new_tokens and r["n_prompt"] == 0)
    return {
        f"pp{prompt_len}_tok_s": pp["avg_ts"],
        f"tg{new_tokens}_tok_s": tg["avg_ts"],
        "pp_stdev": pp["stddev_ts"],
        "tg_stdev": tg["stddev_ts"],
    }


def measure(path: str, a) -> dict:
    git = lambda *c: subprocess.run(["git", "-C", ROOT, *c], capture_output=True, text=True).stdout.strip()  # noqa: E731
    rec = {
        "file": os.path.basename(path),
        "file_bytes": os.path.getsize(path),
        "load_before": loadavg(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "-uno")),
    }
    code = (
        f"import json,sys; sys.path.insert(0,{HERE!r}); from real_models import radixrt_child; "
        f"print('RESULT', json.dumps(radixrt_child({path!r}, {a.prompt_len}, {a.new_tokens}, {a.kv_tokens})))"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        rec["radixrt_error"] = (p.stderr or p.stdout)[-2000:]
    else:
        rec["radixrt"] = json.loads(line[-1][7:])
    rec["load_mid"] = loadavg()
    old = (json.load(open(OUT)) if os.path.exists(OUT) else {}).get("files", {}).get(rec["file"], {})
    if a.skip_llama and "llama_bench" in old:  # radixrt again, llama.cpp's figures from the earlier run
        rec["llama_bench"] = old["llama_bench"]
        rec["llama_bench_from_run_at_load"] = old.get("load_mid")
        rec["radixrt_earlier_run"] = old.get("radixrt")
    else:
        try:
            rec["llama_bench"] = llama_bench(path, a.prompt_len, a.new_tokens, a.reps)
        except subprocess.CalledProcessError as err:
            rec["llama_bench_error"] = err.stderr[-2000:]
    if (
        a.tg_t1 and not a.skip_llama
    ):  # llama.cpp's threads spin at their barriers: -t 2 collapses when the 2 cores are shared
        try:
            out = subprocess.run(
                [
                    os.path.join(BIN, "llama-bench"),
                    "-m",
                    path,
                    "-t",
                    "1",
                    "-p",
                    "0",
                    "-n",
                    str(a.new_tokens),
                    "-r",
                    str(a.reps),
                    "-o",
                    "json",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rec["llama_bench_t1_tg_tok_s"] = json.loads(out.stdout)[0]["avg_ts"]
        except subprocess.CalledProcessError as err:
            rec["llama_bench_t1_error"] = err.stderr[-2000:]
    rec["load_after"] = loadavg()
    r, lb = rec.get("radixrt"), rec.get("llama_bench")
    if r and lb:
        rec["decode_ratio"] = r["decode_tok_s"] / lb[f"tg{a.new_tokens}_tok_s"]
        rec["prefill_ratio"] = r["prefill_tok_s"] / lb[f"pp{a.prompt_len}_tok_s"]
        rec["rss_over_file_kv_mb"] = (r["peak_rss_bytes"] - rec["file_bytes"] - r["kv_pool_bytes"]) / 2**20
    mb = lambda x: f"{x / 2**20:.0f}"  # noqa: E731
    if r:
        print(
            f"{rec['file']}: file {mb(rec['file_bytes'])} MB, peak RSS {mb(r['peak_rss_bytes'])} MB, weights "
            f"{mb(r['weight_bytes'])} MB, KV {mb(r['kv_pool_bytes'])} MB, load {r['load_s']:.1f} s, decode "
            f"{r['decode_tok_s']:.2f} tok/s vs tg {lb and lb[f'tg{a.new_tokens}_tok_s'] or 0:.2f} "
            f"({rec.get('decode_ratio', 0):.2f}x), prefill {r['prefill_tok_s']:.1f} vs pp "
            f"{lb and lb[f'pp{a.prompt_len}_tok_s'] or 0:.1f} ({rec.get('prefill_ratio', 0):.2f}x), "
            f"{'tg -t 1 %.2f, ' % rec['llama_bench_t1_tg_tok_s'] if 'llama_bench_t1_tg_tok_s' in rec else ''}"
            f"load avg {rec['load_before'][0]}/{rec['load_mid'][0]}/{rec['load_after'][0]}",
            flush=True,
        )
    else:
        print(f"{rec['file']}: radixrt failed: {rec['radixrt_error'][-400:]}", flush=True)
    return rec


# ---- check --------------------------------------------------------------------------------------------
def check(path: str, n_prompts: int = 4, n_new: int = 16, port: int = 18089) -> dict:
    from radixrt import Engine

    prompts = [[1] + [2 + (i * 31 + j * 977) % 40000 for j in range(8 + 5 * i)] for i in range(n_prompts)]  # BOS first
    sp = {"max_new_tokens": n_new, "temperature": 0, "ignore_eos": True}
    e = Engine(
        model=path,
        quantization="auto",
        max_total_tokens=1024,
        context_length=1024,
        num_threads=2,
        log_level="warning",
        speculative_algorithm="none",
    )
    alone = []
    for p in prompts:
        e.flush_cache()
        alone.append(e.generate(input_ids=p, sampling_params=sp)["output_ids"])
    e.flush_cache()
    batched = [o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=sp)]
    e.shutdown()
    srv = subprocess.Popen(
        [os.path.join(BIN, "llama-server"), "-m", path, "-t", "2", "-c", "1024", "--port", str(port), "-np", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    theirs = []
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                time.sleep(1)
        for p in prompts:
            body = json.dumps(
                {
                    "prompt": p,
                    "n_predict": n_new,
                    "temperature": 0,
                    "cache_prompt": False,
                    "ignore_eos": True,
                    "return_tokens": True,
                }
            ).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}
            )
            theirs.append(json.loads(urllib.request.urlopen(req, timeout=600).read())["tokens"])
    finally:
        srv.terminate()
        srv.wait()
    same = sum(a == b for x, y in zip(alone, theirs) for a, b in zip(x, y))
    prefix = [
        next((k for k, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y))) for x, y in zip(alone, theirs)
    ]
    res = dict(
        file=os.path.basename(path),
        alone=alone,
        batched=batched,
        llama_server=theirs,
        alone_equals_batched=alone == batched,
        agreement=same / (n_prompts * n_new),
        common_prefix=prefix,
        load=loadavg(),
    )
    print(
        f"check {res['file']}: alone == batched: {res['alone_equals_batched']}; agreement with llama-server "
        f"{res['agreement']:.2f} (common prefix per prompt {prefix})",
        flush=True,
    )
    return res


def save(update: dict) -> None:
    data = json.load(open(OUT)) if os.path.exists(OUT) else {}
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["make", "measure", "check", "all"])
    ap.add_argument("--shapes", default="llama-3.2-1b")
    ap.add_argument("--types", default="Q4_K_M,Q8_0,Q4_0")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r")
    ap.add_argument("--skip-llama", action="store_true", help="radixrt only; keep the file's llama-bench figures")
    ap.add_argument("--tg-t1", action="store_true", help="also llama-bench -t 1 -p 0 (tg only)")
    a = ap.parse_args()
    types = a.types.split(",")
    for shape in a.shapes.split(","):
        if a.step in ("make", "all"):
            make(shape, types)
        if a.step in ("measure", "all"):
            for t in types:
                rec = measure(gguf_path(shape, t), a)
                save({"machine": {"cpus": os.cpu_count()}, "files": {rec["file"]: rec}})
        if a.step in ("check", "all"):
            save({"check": check(gguf_path(shape, types[0]))})


if __name__ == "__main__":
    main()
