"""Engine throughput against the machine's roofline and HF transformers ``generate`` (issue 2).

Prints: the roofline (fp32 matmul GFLOP/s, memory read GB/s); prefill tok/s on a 1024-token prompt;
decode tok/s at batch 1, 8, 32, 64; HF ``generate`` at the same batch sizes; batch 32 with mixed
output lengths against HF. Each figure also appears as a share of the roofline:
batch-1 decode against weight bytes / bandwidth, larger batches and prefill against
2 x params x tokens / FLOP/s.

Then, per weight format (``--formats``, issue 12): batch-1 decode tok/s (best of three rounds, each right
after a bandwidth probe; fp32's share of the memory roofline is the median round's), its ratio to fp32 and
to HF, and the share of the step inside the weight matmuls from the torch profiler (``step_profile.py``);
after q4, llama.cpp's ``llama-bench`` tg128 on the same GGUF (built by ``make peers``; a notice when absent).
The lines above run fp32 (``--quantization none``), the format HF runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from peers import llama_bench_tg  # noqa: E402
from roofline import matmul_gflops, read_gbps  # noqa: E402
from step_profile import matmul_share  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.models.loader import default_gguf_path, load_hf_model, load_state_dict, load_tokenizer  # noqa: E402


def decode_tps(engine, prompts, new_tokens) -> float:
    """Output tokens per second of the decode phase (after every request has its first token)."""
    sps = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in new_tokens]
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=sps)
    end = time.perf_counter()
    first = max(o["meta_info"]["ttft"] for o in outs) + t0
    tokens = sum(o["meta_info"]["completion_tokens"] - 1 for o in outs)
    return tokens / (end - first)


def hf_tps(hf, prompts, new_tokens: int) -> float:
    ids = torch.tensor(prompts)
    t = time.perf_counter()
    with torch.no_grad():
        hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return len(prompts) * new_tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--formats", default="none,q4,int8,fp16", help="weight formats for the batch-1 lines")
    ap.add_argument("--out", default="benchmarks/results/bench_engine.json")
    args = ap.parse_args()
    gflops, gbps = matmul_gflops(), read_gbps()
    print(f"roofline: fp32 matmul {gflops:.1f} GFLOP/s, memory read {gbps:.1f} GB/s")
    engine = Engine(
        speculative_algorithm="none",
        max_total_tokens=16384,
        max_running_requests=64,
        chunked_prefill_size=1024,
        quantization="none",
    )
    tok = load_tokenizer()
    sd = load_state_dict()
    params = sum(v.numel() for v in sd.values())  # the head is tied: counted once
    weight_bytes = params * 4
    compute_tps = gflops * 1e9 / (2 * params)
    # a prefill token multiplies only the layers' weights: the embedding is a lookup, the head runs once
    layer_params = sum(v.numel() for k, v in sd.items() if "embed_tokens" not in k and "lm_head" not in k)
    prefill_tps = gflops * 1e9 / (2 * layer_params)
    mem_tps = gbps * 1e9 / weight_bytes
    print(
        f"model: {params / 1e6:.1f}M params, {weight_bytes / 1e6:.0f} MB fp32; roofline: batch-1 decode "
        f"{mem_tps:.1f} tok/s (memory), compute-bound {compute_tps:.0f} tok/s"
    )
    results = {"gflops": gflops, "gbps": gbps, "params": params}
    text = open(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "passage.txt")).read()
    ids = tok.encode(text * 3, add_special_tokens=False)
    prompt = ids[:1024]
    engine.generate(input_ids=prompt[:64], sampling_params={"max_new_tokens": 1})  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0})
    pre = 1024 / (time.perf_counter() - t)
    print(
        f"prefill 1024 tokens: {pre:.0f} tok/s = {pre / prefill_tps:.0%} of compute roofline "
        f"(the layers' matmuls, {prefill_tps:.0f} tok/s; attention not counted)"
    )
    results["prefill_tps"] = pre
    hf = load_hf_model()
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        engine.flush_cache()
        prompts = [ids[i * 7 : i * 7 + args.prompt_len] for i in range(bs)]
        tps = decode_tps(engine, prompts, [args.new_tokens] * bs)
        share = tps / mem_tps if bs == 1 else tps / compute_tps
        kind = "memory" if bs == 1 else "compute"
        h = hf_tps(hf, prompts, args.new_tokens)
        print(
            f"decode batch {bs:3d}: {tps:7.1f} tok/s = {share:5.0%} of {kind} roofline | HF generate "
            f"{h:7.1f} tok/s | ratio {tps / h:4.1f}x"
        )
        results[f"decode_bs{bs}"] = {"radixrt": tps, "hf": h, "share": share}
    # Batch 32 with mixed output lengths: HF's static batch runs until the longest finishes.
    lens = [8 + (i * 13) % 57 for i in range(32)]
    prompts = [ids[i * 7 : i * 7 + args.prompt_len] for i in range(32)]
    engine.flush_cache()
    t = time.perf_counter()
    engine.generate(
        input_ids=prompts, sampling_params=[{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in lens]
    )
    ours = sum(lens) / (time.perf_counter() - t)
    t = time.perf_counter()
    with torch.no_grad():
        hf.generate(
            torch.tensor(prompts), max_new_tokens=max(lens), min_new_tokens=max(lens), do_sample=False, pad_token_id=2
        )
    theirs = sum(lens) / (time.perf_counter() - t)  # only the useful tokens count
    print(
        f"batch 32 mixed lengths (8..64 new tokens): radixrt {ours:.1f} tok/s | HF {theirs:.1f} tok/s | "
        f"ratio {ours / theirs:.1f}x"
    )
    results["mixed_bs32"] = {"radixrt": ours, "hf": theirs}
    engine.shutdown()
    prompt1 = [ids[: args.prompt_len]]
    hf1 = hf_tps(hf, prompt1, args.new_tokens)
    fp32_tps = None
    for fmt in args.formats.split(","):
        e = Engine(max_total_tokens=4096, quantization=fmt, speculative_algorithm="none")
        decode_tps(e, prompt1, [4])  # warm-up
        # three rounds of (bandwidth probe, decode): this VM's bandwidth drifts by a third within minutes
        rounds = [(read_gbps(256) * 1e9 / weight_bytes, decode_tps(e, prompt1, [args.new_tokens])) for _ in range(3)]
        tps = max(t for _, t in rounds)
        share = sorted(t / m for m, t in rounds)[1]
        fp32_tps = fp32_tps or tps
        prof = matmul_share(e, prompt1[0], args.new_tokens)
        extra = f" = {share:.0%} of memory roofline (median of 3 rounds)" if fmt == "none" else ""
        print(
            f"weights {fmt:5}: batch-1 decode {tps:6.1f} tok/s{extra} | {tps / fp32_tps:4.2f}x fp32 | "
            f"{tps / hf1:4.2f}x HF | weight matmuls {prof['share']:.0%} of the step "
            f"({prof['matmul_ms']:.1f} of {prof['wall_ms']:.1f} ms)"
        )
        results[f"weights_{fmt}"] = {"tps": tps, "hf": hf1, "roofline_share": share, "rounds": rounds, **prof}
        e.shutdown()
        if fmt == "q4":  # llama.cpp's batch-1 decode on the same GGUF (its own Q4_1 weights), same threads
            try:
                lb = llama_bench_tg(default_gguf_path(), torch.get_num_threads())
                print(
                    f"weights q4   : llama.cpp llama-bench tg{lb['n_gen']} {lb['tok_s']:7.1f} tok/s "
                    f"({lb['threads']} threads) | radixrt q4 / llama.cpp {tps / lb['tok_s']:4.2f}x"
                )
                results["llama_bench_tg"] = {**lb, "radixrt_ratio": tps / lb["tok_s"]}
            except (FileNotFoundError, RuntimeError) as e:
                print(f"weights q4   : llama.cpp not run ({e})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
