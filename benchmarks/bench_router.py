"""Data-parallel routing, simulated (issue 17): hit rate and load balance per policy and replica count.

Workload: K tenants, each with a long system prompt; each tenant runs S multi-turn sessions of T turns.
Turn t's prompt is the system prompt plus the whole conversation so far (user turns and replies), so a
session's next turn shares everything with its last one. Sessions start at random times; a session's next
turn arrives after its previous reply finished plus an exponential think time.

Replay: each replica is a real ``RadixCache`` + ``PageAllocator`` (radixrt.runtime.mem) with a fixed pool of
``--replica-tokens``. A routed request does ``match_prefix`` (its hit = matched pages x page size), evicts
LRU leaves if the pool is short, and inserts prompt + reply, exactly as the scheduler does when a request
finishes. Its service time is modeled as ``miss_tokens * prefill_cost + reply_tokens * decode_cost``
(arbitrary time units); the load a policy sees is the number of requests in flight on each replica.

Reported per policy and replica count: hit rate (cached prompt tokens / prompt tokens), requests routed to
the busiest / least busy replica (max/min), and peak in-flight requests max/min across replicas.

    python benchmarks/bench_router.py                       # the table in benchmarks/results/bench_router.md
    python benchmarks/bench_router.py --replicas 2,4 --tenants 4 --sessions 4
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from radixrt.runtime.mem.allocator import PageAllocator  # noqa: E402
from radixrt.runtime.mem.radix_cache import RadixCache  # noqa: E402
from radixrt.runtime.router.policy import make_policy  # noqa: E402

VARIANTS = {  # table name -> (policy name, pass the session key)
    "cache_aware": ("cache_aware", False),
    "cache_aware+session": ("cache_aware", True),
    "round_robin": ("round_robin", False),
    "power_of_two": ("power_of_two", False),
    "consistent_hash(session)": ("consistent_hash", True),
}


@dataclass
class Turn:
    session: int
    prompt: list[int]
    reply: list[int]


def sessions(
    tenants: int, per_tenant: int, turns: int, sys_len: int, user_len: int, reply_len: int, seed: int
) -> list[list[Turn]]:
    """Every session's turns, in order. Token ids are random (they only need to differ)."""
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(100, 49000) for _ in range(n)]  # noqa: E731
    systems = [draw(sys_len) for _ in range(tenants)]
    out = []
    for t in range(tenants):
        for _ in range(per_tenant):
            history, conv = list(systems[t]), []
            for _ in range(turns):
                history += draw(user_len)
                reply = draw(reply_len)
                conv.append(Turn(len(out), list(history), reply))
                history += reply
            out.append(conv)
    return out


class Replica:
    def __init__(self, tokens: int, page_size: int):
        self.alloc = PageAllocator(tokens // page_size)
        self.tree = RadixCache(page_size, self.alloc)
        self.ps = page_size
        self.routed = self.in_flight = self.peak = 0

    def serve(self, prompt: list[int], reply: list[int]) -> int:
        """Match, evict if short, insert prompt + reply. Returns the prompt tokens served from cache."""
        seq = prompt + reply
        m = self.tree.match_prefix(seq)
        hit = min(len(m.pages) * self.ps, len(prompt))
        need = len(seq) // self.ps - len(m.pages)
        self.tree.inc_lock_ref(m.last_node)  # the matched prefix must survive our own eviction
        if self.alloc.num_free < need:
            self.tree.evict(need - self.alloc.num_free)
        self.tree.dec_lock_ref(m.last_node)
        new = self.alloc.allocate(need)
        if new is None:  # the sequence alone is larger than the pool: it is not cached
            return hit
        dup = self.tree.insert(seq, m.pages + new) // self.ps
        self.alloc.free((m.pages + new)[len(m.pages) : dup])  # pages the tree already had (none here)
        return hit


def simulate(convs: list[list[Turn]], n: int, variant: str, a) -> dict:
    name, use_session = VARIANTS[variant]
    # the router's approximate tree per replica is sized like the replica's KV pool
    policy = make_policy(name, max_tree_tokens=a.replica_tokens) if name == "cache_aware" else make_policy(name)
    reps = {f"r{i:02d}": Replica(a.replica_tokens, a.page_size) for i in range(n)}
    rng = random.Random(a.seed + 1)
    mean_service = a.user_len * a.prefill_cost + a.reply_len * a.decode_cost
    # arrivals scale with n so that each replica holds about a.concurrency requests at a time
    horizon = len(convs) * a.turns * mean_service / (a.concurrency * n)
    events = [(rng.uniform(0, horizon), 0, s, 0) for s in range(len(convs))]  # (time, kind, session, turn)
    heapq.heapify(events)
    hit = total = 0
    while events:
        now, kind, s, turn = heapq.heappop(events)
        if kind == 1:  # a reply finished on replica `turn` (reused as the replica id slot)
            reps[turn].in_flight -= 1
            continue
        t = convs[s][turn]
        loads = {r: rep.in_flight for r, rep in reps.items()}
        rid = policy.select(t.prompt, loads, f"s{s}" if use_session else None)
        rep = reps[rid]
        h = rep.serve(t.prompt, t.reply)
        hit, total = hit + h, total + len(t.prompt)
        rep.routed += 1
        rep.in_flight += 1
        rep.peak = max(rep.peak, rep.in_flight)
        done = now + (len(t.prompt) - h) * a.prefill_cost + len(t.reply) * a.decode_cost
        heapq.heappush(events, (done, 1, s, rid))
        if turn + 1 < len(convs[s]):
            heapq.heappush(events, (done + rng.expovariate(1 / (mean_service * a.think)), 0, s, turn + 1))
    for rep in reps.values():
        rep.tree.check_invariants()
    routed = [r.routed for r in reps.values()]
    peaks = [r.peak for r in reps.values()]
    return {
        "replicas": n,
        "policy": variant,
        "hit_rate": hit / total,
        "requests": sum(routed),
        "routed_max": max(routed),
        "routed_min": min(routed),
        "peak_max": max(peaks),
        "peak_min": min(peaks),
    }


def table(rows: list[dict]) -> str:
    lines = ["| replicas | policy | hit rate | requests max/min | peak in-flight max/min |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['replicas']} | {r['policy']} | {r['hit_rate']:.3f} | {r['routed_max']}/{r['routed_min']} "
            f"| {r['peak_max']}/{r['peak_min']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", default="2,4,8,16")
    p.add_argument("--policies", default=",".join(VARIANTS))
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--sessions", type=int, default=8, help="sessions per tenant")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--sys-len", type=int, default=2048, help="system prompt tokens")
    p.add_argument("--user-len", type=int, default=64)
    p.add_argument("--reply-len", type=int, default=64)
    p.add_argument("--replica-tokens", type=int, default=32768, help="KV pool of one replica, tokens")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--prefill-cost", type=float, default=1.0, help="time units per uncached prompt token")
    p.add_argument("--decode-cost", type=float, default=20.0, help="time units per reply token")
    p.add_argument("--concurrency", type=float, default=4.0, help="target requests in flight per replica")
    p.add_argument("--think", type=float, default=1.0, help="mean think time, in mean service times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bench_router"))
    a = p.parse_args(argv)
    convs = sessions(a.tenants, a.sessions, a.turns, a.sys_len, a.user_len, a.reply_len, a.seed)
    one = Replica(1 << 24, a.page_size)  # the bound: one cache that never evicts, turns in session order
    ideal = sum(one.serve(t.prompt, t.reply) for c in convs for t in c) / sum(len(t.prompt) for c in convs for t in c)
    rows = []
    for n in map(int, a.replicas.split(",")):
        for v in a.policies.split(","):
            t0 = time.perf_counter()
            rows.append(simulate(convs, n, v, a))
            print(
                f"n={n:2d} {v:26s} hit={rows[-1]['hit_rate']:.3f} "
                f"routed {rows[-1]['routed_max']}/{rows[-1]['routed_min']} ({time.perf_counter() - t0:.1f}s)",
                flush=True,
            )
    head = (
        f"{a.tenants} tenants x {a.sessions} sessions x {a.turns} turns, system prompt {a.sys_len} tokens, "
        f"user {a.user_len} / reply {a.reply_len} tokens per turn, {a.replica_tokens} KV tokens per replica, "
        f"page {a.page_size}, ~{a.concurrency:g} requests in flight per replica, seed {a.seed}. "
        f"Upper bound (one cache that never evicts): hit rate {ideal:.3f}."
    )
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out + ".json", "w") as f:
            json.dump({"config": vars(a), "rows": rows}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(f"# Routing simulation (benchmarks/bench_router.py)\n\n{head}\n\n{table(rows)}\n")
    print(head)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
