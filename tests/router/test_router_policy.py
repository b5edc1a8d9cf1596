"""Routing policies without Ray, fed real SmolLM2 token ids."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from radixrt.runtime.router.approx_tree import ApproxTree
from radixrt.runtime.router.policy import (
    CacheAwarePolicy,
    ConsistentHashPolicy,
    PowerOfTwoPolicy,
    RoundRobinPolicy,
    make_policy,
)

SYS_A = "You are a billing assistant for ACME Corp. Answer questions about invoices, refunds and plans. " * 3
SYS_B = "You are a travel agent. Plan trips, find flights, compare hotels and explain visa rules clearly. " * 3


@pytest.fixture(scope="module")
def enc(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def test_approx_tree_match_insert_split_evict(enc):
    t = ApproxTree(max_tokens=1000)
    a, b = enc(SYS_A + "How do I get a refund?"), enc(SYS_A + "Cancel my plan.")
    t.insert(a)
    assert t.size == len(a)
    assert t.match(a) == len(a)
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert t.match(b) == common
    t.insert(b)  # splits the edge at the first difference
    assert t.size == len(a) + len(b) - common
    assert t.match(b) == len(b)
    # eviction: a small tree keeps the most recently used leaf, the shared prefix stays with it
    t2 = ApproxTree(max_tokens=len(b))
    t2.insert(a)
    t2.insert(b)
    assert t2.size == len(b)
    assert t2.match(b) == len(b) and t2.match(a) == common


def test_cache_aware_affinity_when_balanced(enc):
    p = CacheAwarePolicy(cache_threshold=0.5)
    loads = {"r0": 0, "r1": 0, "r2": 0}
    first = p.select(enc(SYS_A + "Hi"), loads)
    assert first == "r0"  # all empty and idle: the first id
    loads[first] += 1
    # a different tenant: no match above the threshold -> the least-loaded replica (r1, then by id)
    other = p.select(enc(SYS_B + "Hi"), loads)
    assert other == "r1"
    loads[other] += 1
    # same tenant again, a new question: the system prompt matches > 50% -> back to r0 though r2 is idle
    assert p.select(enc(SYS_A + "Where is my invoice for March?"), loads) == "r0"
    assert p.select(enc(SYS_B + "Find me a flight to Oslo."), loads) == "r1"


def test_cache_aware_keeps_affinity_in_near_least_loaded_window(enc):
    """Imbalanced load: the cached replica still wins if it is within abs_threshold of the minimum."""
    p = CacheAwarePolicy(cache_threshold=0.5, balance_abs_threshold=2, balance_rel_threshold=1.5)
    prompt_a, prompt_b = enc(SYS_A + "Q1"), enc(SYS_B + "Q1")
    assert p.select(prompt_a, {"r2": 0}) == "r2"  # r2 now caches tenant A
    assert p.select(prompt_b, {"r0": 0}) == "r0"  # r0 caches tenant B
    loads = {"r0": 9, "r1": 0, "r2": 2}  # imbalanced: 9 - 0 > 2 and 9 > 0
    assert p.select(enc(SYS_A + "Q2"), loads) == "r2"  # in the window (2 <= 0 + 2): affinity kept
    assert p.select(enc(SYS_B + "Q2"), loads) == "r1"  # r0 is overloaded: shed to the least-loaded
    assert p.select(enc("Unrelated prompt with no cached prefix anywhere."), loads) == "r1"


def test_cache_aware_sticky_session_and_remove(enc):
    p = CacheAwarePolicy()
    loads = {"r0": 0, "r1": 0}
    assert p.select(enc("turn one of agent 7"), loads, session="agent-7") == "r0"
    loads["r0"] = 3
    # a totally different prompt of the same session still goes to r0 (sticky), though r1 is idle
    assert p.select(enc(SYS_B), loads, session="agent-7") == "r0"
    assert p.select(enc(SYS_A), loads, session="agent-8") == "r1"  # no match: least-loaded
    p.remove("r0")
    assert "r0" not in p.trees and "agent-7" not in p.sessions
    assert p.select(enc("turn three"), {"r1": 1}, session="agent-7") == "r1"


def test_baselines(enc):
    rr = RoundRobinPolicy()
    loads = {"a": 5, "b": 0, "c": 1}
    assert [rr.select([1], loads) for _ in range(5)] == ["a", "b", "c", "a", "b"]
    p2 = PowerOfTwoPolicy(seed=1)
    picks = [p2.select([1], loads) for _ in range(50)]
    assert "a" not in picks  # a is the heaviest: it loses every pair it is drawn in
    assert set(picks) == {"b", "c"}
    ch = ConsistentHashPolicy()
    sessions = [f"s{i}" for i in range(200)]
    four = {f"r{i}": 0 for i in range(4)}
    before = {s: ch.select([], four, session=s) for s in sessions}
    assert before == {s: ch.select([], four, session=s) for s in sessions}  # stable
    assert len(set(before.values())) == 4
    three = {r: 0 for r in four if r != "r3"}
    after = {s: ch.select([], three, session=s) for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert moved and all(before[s] == "r3" for s in moved)  # only r3's sessions move
    # no session key: the prompt's first tokens are the key, so one tenant maps to one replica
    head = ConsistentHashPolicy(hash_prefix_tokens=32)
    assert len(enc(SYS_A)) > 32
    assert head.select(enc(SYS_A + "x"), four) == head.select(enc(SYS_A + "y"), four)


def test_bad_input():
    with pytest.raises(ValueError, match="loads"):
        CacheAwarePolicy().select([1, 2], {})
    with pytest.raises(ValueError, match="router_policy"):
        make_policy("random")
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwarePolicy(cache_threshold=2.0)
    with pytest.raises(ValueError, match="max_tokens"):
        ApproxTree(0)
    assert make_policy("power_of_two", seed=3).name == "power_of_two"


def test_simulation_smoke():
    """benchmarks/bench_router.py on a tiny workload: real radix trees; cache-aware beats round-robin."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_router as br

    a = argparse.Namespace(
        turns=3,
        user_len=16,
        reply_len=16,
        replica_tokens=2048,
        page_size=16,
        prefill_cost=1.0,
        decode_cost=20.0,
        concurrency=2.0,
        think=1.0,
        seed=0,
    )
    convs = br.sessions(tenants=4, per_tenant=3, turns=3, sys_len=256, user_len=16, reply_len=16, seed=0)
    rows = {v: br.simulate(convs, 4, v, a) for v in ("cache_aware", "round_robin", "consistent_hash(session)")}
    assert all(r["requests"] == 36 for r in rows.values())
    assert rows["round_robin"]["routed_max"] == rows["round_robin"]["routed_min"] == 9
    assert rows["cache_aware"]["hit_rate"] > rows["round_robin"]["hit_rate"] + 0.1, rows
