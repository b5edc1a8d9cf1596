"""Radix prefix cache in the engine (issue 3) and edge cases 1-3."""

from __future__ import annotations

import random
import string

import pytest

from conftest import close_engine, make_engine, wait_idle
from radixrt.runtime.io_struct import GenerateReq, SamplingParams, kind
from radixrt.runtime.scheduler.request import Req
from radixrt.runtime.scheduler.schedule_policy import order_waiting

P = 16
G4 = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


def _overlapping_prompts(n: int = 16, length: int = 128) -> list[str]:
    # 128 characters: 95-108 tokens a prompt, 25-73 of them (1-4 pages of 16) shared with an earlier one
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits
    bases = ["".join(rng.choice(alphabet) for _ in range(length)) for _ in range(4)]
    out = []
    for i in range(n):
        cut = rng.randrange(length // 4, length * 7 // 8)
        out.append(bases[i % 4][:cut] + "".join(rng.choice(alphabet) for _ in range(length - cut)))
    return out


@pytest.fixture(scope="module")
def cold_engine():
    e = make_engine(disable_radix_cache=True)
    yield e
    close_engine(e)


def test_cache_on_off_identical_in_any_order(engine, cold_engine):
    prompts = _overlapping_prompts()
    orders = {
        "in_order": list(range(16)),
        "reversed": list(range(15, -1, -1)),
        "interleaved": [i for pair in zip(range(8), range(8, 16)) for i in pair],
    }
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    results = {}
    for name, eng in (("on", engine), ("off", cold_engine)):
        for oname, order in orders.items():
            outs = eng.generate([prompts[i] for i in order], sp)
            results[(name, oname)] = {i: o["output_ids"] for i, o in zip(order, outs)}
            if name == "off":
                assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    ref = results[("off", "in_order")]
    for key, res in results.items():
        assert res == ref, key
    assert engine.get_server_info()["cache"]["hit_tokens"] > 0


def test_fully_cached_prompts(engine, passage_ids):
    """Edge case 1: lengths 1, P-1, P, P+1, 2P twice; then a strict prefix of a longer cached prompt."""
    assert engine.flush_cache() is True
    for L in (1, P - 1, P, P + 1, 2 * P):
        ids = passage_ids[100 : 100 + L]
        cold = engine.generate(input_ids=ids, sampling_params=G4)
        warm = engine.generate(input_ids=ids, sampling_params=G4)
        assert warm["output_ids"] == cold["output_ids"]
        assert warm["meta_info"]["cached_tokens"] == (L - 1) // P * P <= L - 1
    long = passage_ids[300:340]
    engine.generate(input_ids=long, sampling_params=G4)
    prefix = long[:33]
    warm = engine.generate(input_ids=prefix, sampling_params=G4)
    assert warm["meta_info"]["cached_tokens"] == 32
    assert engine.flush_cache() is True
    cold = engine.generate(input_ids=prefix, sampling_params=G4)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == cold["output_ids"]


def test_input_logprobs_with_cache_hit(engine, passage_ids):
    """Edge case 2: P+1 ids, input logprobs from position 0, sent twice."""
    ids = passage_ids[200 : 200 + P + 1]
    outs = [
        engine.generate(input_ids=ids, sampling_params=G4, return_logprob=True, logprob_start_len=0) for _ in range(2)
    ]
    a, b = (o["meta_info"]["input_token_logprobs"] for o in outs)
    assert len(a) == len(b) == P + 1 and a[0] is None and b[0] is None
    for x, y in zip(a[1:], b[1:]):
        assert x[1] == y[1] and abs(x[0] - y[0]) < 1e-5
    assert outs[1]["meta_info"]["cached_tokens"] == 0  # every position's logits were recomputed
    # From the middle: the cache may serve what comes before logprob_start_len - 1.
    c = engine.generate(input_ids=ids, sampling_params=G4, return_logprob=True, logprob_start_len=P)
    assert len(c["meta_info"]["input_token_logprobs"]) == 1
    # 3e-5: the cascade path sums the cached prefix in another order than the uncached run (fp32)
    assert abs(c["meta_info"]["input_token_logprobs"][0][0] - a[P][0]) < 3e-5


def test_abort_then_reuse(passage_ids):
    """Edge case 3: abort after the first chunk, and during a chunked prefill, 8 times each (the second
    loop steps by hand, so each of its rounds is the same; the first aborts wherever the stream is)."""
    e = make_engine(chunked_prefill_size=32, max_num_batched_tokens=48)
    try:
        ids = passage_ids[:90]
        e.flush_cache()
        cold = e.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
        for _ in range(8):
            gen = e.generate(
                input_ids=ids,
                sampling_params={"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
                stream=True,
            )
            next(gen)
            gen.close()
            again = e.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
            assert again["output_ids"] == cold["output_ids"]
        for i in range(8):
            e.flush_cache()
            state = e._call(lambda: _prefill_one_chunk_then_abort(e.scheduler, ids, f"chunk-abort-{i}"))
            assert state == (32, "abort")
            st = wait_idle(e)
            assert st["free_pages"] + st["evictable_pages"] == st["total_pages"]
            assert st["evictable_pages"] == 2  # the one finished chunk (32 tokens) stayed cached
            again = e.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
            assert again["output_ids"] == cold["output_ids"]
            assert again["meta_info"]["cached_tokens"] == 32
    finally:
        close_engine(e)


def _prefill_one_chunk_then_abort(s, ids, rid):
    s.add_request(GenerateReq(rid=rid, input_ids=ids, sampling_params=SamplingParams(max_new_tokens=8, temperature=0)))
    s.step()
    req = next(r for r in s.running if r.rid == rid)
    computed = req.num_computed
    s.abort(rid)
    return computed, kind(s.finished_outs[-1].finished_reason)


def test_multi_turn_reuses_answer(engine, tokenizer):
    engine.flush_cache()
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    p1 = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids1 = tokenizer.encode(p1, add_special_tokens=False)
    a1 = engine.generate(input_ids=ids1, sampling_params={"max_new_tokens": 24, "temperature": 0})
    turn1 = ids1 + a1["output_ids"]
    more = tokenizer.encode(
        "\n<|im_start|>user\nAnd two more?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    a2 = engine.generate(input_ids=turn1 + more, sampling_params={"max_new_tokens": 8, "temperature": 0})
    # Every token of turn 1 has KV except the last sampled one, so the reuse bound is len - 1, page-aligned.
    assert a2["meta_info"]["cached_tokens"] >= (len(turn1) - 1) // P * P
    assert a2["meta_info"]["cached_tokens"] >= len(ids1) // P * P


def test_eviction_under_pressure(engine, passage_ids):
    prompts = [passage_ids[i * 37 : i * 37 + 40] for i in range(12)]
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    ref = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=sp)]
    e = make_engine(max_total_tokens=16 * P)
    try:
        for _ in range(2):
            outs = e.generate(input_ids=prompts, sampling_params=sp)
            assert [o["output_ids"] for o in outs] == ref
        st = wait_idle(e)
        assert st["total_pages"] == 16 and st["free_pages"] + st["evictable_pages"] == 16
        assert st["evictable_pages"] > 0
    finally:
        close_engine(e)


def test_salt_isolates_tenants(engine, passage_ids):
    ids = passage_ids[400:450]
    engine.generate(input_ids=ids, sampling_params=G4, cache_salt="tenant-a")
    b = engine.generate(input_ids=ids, sampling_params=G4, cache_salt="tenant-b")
    a = engine.generate(input_ids=ids, sampling_params=G4, cache_salt="tenant-a")
    assert b["meta_info"]["cached_tokens"] == 0
    assert a["meta_info"]["cached_tokens"] == 48
    assert a["output_ids"] == b["output_ids"]


def test_server_info_cache_dict(engine):
    c = engine.get_server_info()["cache"]
    for k in ("total_pages", "free_pages", "evictable_pages", "protected_pages", "hit_tokens", "query_tokens"):
        assert isinstance(c[k], int)
    assert c["total_pages"] == 8192 // P


def test_lpm_ages_cold_requests():
    """Policy level: a request that waited past the bound goes first whatever its match."""
    from radixrt.runtime.mem.allocator import PageAllocator
    from radixrt.runtime.mem.radix_cache import RadixCache

    alloc = PageAllocator(64)
    tree = RadixCache(4, alloc)
    hot = list(range(100, 132))
    tree.insert(hot, alloc.allocate(8))
    sp = SamplingParams()
    reqs = [Req(f"h{i}", hot + [i], sp, 4, arrival=i + 1) for i in range(5)]
    cold = Req("cold", [7] * 33, sp, 4, arrival=0)
    assert order_waiting(reqs + [cold], "lpm", tree, 4)[-1] is cold
    cold.wait_steps = 5
    assert order_waiting(reqs + [cold], "lpm", tree, 4)[0] is cold
    assert [r.rid for r in order_waiting(reqs + [cold], "fcfs", tree, 4)][:2] == ["cold", "h0"]


def _cold_finish_order(passage_ids, max_wait_steps: int) -> tuple[int, dict[str, int]]:
    """6 hot requests and then a cold one arrive together; after the first step (one request runs at a time)
    a stream of 10 more hot ones arrives while they wait. The steps run by hand on the engine's thread, so
    when the later requests come is a step, not a moment. Returns the cold request's place in the finish
    order (0-based) and the step each request finished at."""
    # no speculation: its drafts (chosen from measured step times) would change how many steps a request takes
    e = make_engine(max_running_requests=1, max_wait_steps=max_wait_steps, speculative_algorithm="none")
    try:
        hot = passage_ids[:64]
        e.generate(input_ids=hot + [11], sampling_params=G4)  # the hot prefix is cached
        first = [hot + [20 + i] for i in range(6)] + [passage_ids[500:560]]
        later = [hot + [40 + i] for i in range(10)]

        def run(s):
            def add(rids, prompts):
                for rid, ids in zip(rids, prompts):
                    s.add_request(GenerateReq(rid=rid, input_ids=ids, sampling_params=SamplingParams(**G4)))

            add([f"hot-{i}" for i in range(6)] + ["cold"], first)
            done, cached, step = {}, {}, 0
            while s.has_work:
                if step == 1:
                    add([f"later-{i}" for i in range(10)], later)
                for o in s.step():
                    cached.setdefault(o.rid, o.cached_tokens)
                    if o.finished_reason is not None:
                        done[o.rid] = step
                step += 1
            return done, cached

        done, cached = e._call(lambda: run(e.scheduler))
        assert cached["cold"] == 0 and all(cached[f"hot-{i}"] == 64 for i in range(6))
        order = sorted(done, key=done.get)
        return order.index("cold"), done
    finally:
        close_engine(e)


def test_no_starvation_under_lpm(passage_ids):
    """A cold request among a stream of hot ones finishes within the aging bound: right after the
    requests that arrived before it (once they have all waited past the bound, they go in arrival order).
    Without aging, LPM serves every later hot request first. One request runs at a time and takes 4 steps
    (the 1-token extend after its 64 cached tokens samples the first token, then 3 decodes)."""
    rank, done = _cold_finish_order(passage_ids, max_wait_steps=6)
    assert [done[f"hot-{i}"] for i in range(6)] == [4 * i + 3 for i in range(6)]
    assert rank == 6 and done["cold"] == 27
    rank, done = _cold_finish_order(passage_ids, max_wait_steps=10**6)
    assert sorted(done.values()) == [4 * i + 3 for i in range(17)]
    assert rank == 16 and done["cold"] == 67  # last: behind the 10 hot requests that came after it


def test_dfs_weight_and_fcfs_policies(passage_ids, engine):
    prompts = [passage_ids[:48] + [30 + i] for i in range(4)] + [passage_ids[200:248] + [50 + i] for i in range(4)]
    ref = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=G4)]
    for policy in ("dfs-weight", "fcfs"):
        e = make_engine(schedule_policy=policy)
        try:
            outs = e.generate(input_ids=prompts, sampling_params=G4)
            assert [o["output_ids"] for o in outs] == ref
            assert sum(o["meta_info"]["cached_tokens"] for o in outs) >= 6 * 48
        finally:
            close_engine(e)


def test_one_hit_per_request_however_often_admitted():
    """An admission retried for want of pages (released, then admitted again next step) or after a
    preemption counts one hit on its prefix, not one per try: LFU/GDSF rank by hits."""
    from radixrt.runtime.mem.req_pages import ReqPages

    req_pages = ReqPages(4, 64, True, "lfu")
    hot = list(range(100, 116))
    req_pages.tree.insert(hot, req_pages.allocator.allocate(4))
    req = Req("r", hot + [1, 2], SamplingParams(), 4)
    for _ in range(3):
        assert req_pages.admit(req) == 16
        req_pages.release(req)
    node = req_pages.tree.match_prefix(hot).last_node
    assert (node.key, node.hit_count) == (hot, 1)
    other = Req("s", hot + [3], SamplingParams(), 4)
    req_pages.admit(other)
    req_pages.release(other)
    assert node.hit_count == 2
    assert req_pages.allocator.num_free + req_pages.tree.evictable_pages == 64 and req_pages.tree.protected_pages == 0
