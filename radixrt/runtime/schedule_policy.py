"""Order of the waiting queue.

- ``fcfs``: arrival order.
- ``lpm``: longest prefix match first (SGLang, Zheng et al. 2024), with aging: a request that has
  waited more than ``max_wait_steps`` steps goes first, so cache-cold requests are not starved.
- ``dfs-weight``: requests grouped by the tree node they match, visited depth-first with the heaviest
  subtree (most waiting requests) first, so requests sharing a prefix run together (SGLang).
"""
from __future__ import annotations

from collections import defaultdict

from radixrt.runtime.request import Req


def order_waiting(waiting: list[Req], policy: str, tree, max_wait_steps: int) -> list[Req]:
    if tree is None or policy == "fcfs" or len(waiting) <= 1:
        return sorted(waiting, key=lambda r: r.arrival)
    aged = sorted((r for r in waiting if r.wait_steps > max_wait_steps), key=lambda r: r.arrival)
    rest = [r for r in waiting if r.wait_steps <= max_wait_steps]
    matches = {r: tree.match_prefix(r.fill_ids[: r.max_cacheable_prefix()], r.cache_salt) for r in rest}
    if policy == "lpm":
        rest.sort(key=lambda r: (-len(matches[r].pages), r.arrival))
        return aged + rest
    # dfs-weight
    by_node = defaultdict(list)
    for r in rest:
        by_node[matches[r].last_node].append(r)
    weight: dict = defaultdict(int)
    for node, reqs in by_node.items():
        n = node
        while n is not None:
            weight[n] += len(reqs)
            n = n.parent
    roots = {n for n in weight if n.parent is None}
    out: list[Req] = []

    def visit(node) -> None:
        out.extend(sorted(by_node.get(node, []), key=lambda r: r.arrival))
        kids = [c for c in node.children.values() if c in weight]
        for c in sorted(kids, key=lambda c: -weight[c]):
            visit(c)

    for root in sorted(roots, key=lambda n: -weight[n]):
        visit(root)
    return aged + out
