"""Order of the waiting queue.

- ``fcfs``: arrival order.
- ``lpm``: longest prefix match first (SGLang, Zheng et al. 2024), with aging: a request that has
  waited more than ``max_wait_steps`` steps goes first, so cache-cold requests are not starved.
- ``dfs-weight``: requests grouped by the tree node they match, visited depth-first with the heaviest
  subtree (most waiting requests) first, so requests sharing a prefix run together (SGLang).
"""

from __future__ import annotations

from collections import defaultdict

from radixrt.runtime.scheduler.request import Req

# Among waiting requests, one whose not-yet-cached part shares at least this many tokens with a request
# admitted in the same step waits one step and then hits that request's KV (in-batch prefix sharing).
IN_BATCH_SHARE_MIN = 32


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


def shares_uncached(tree, req: Req, admitted: list[Req], page_size: int) -> bool:
    """True when ``req``'s not-yet-cached part shares at least ``max(IN_BATCH_SHARE_MIN, page_size)``
    tokens with a request admitted this step: ``req`` then waits one step and hits that request's KV."""
    if not admitted:
        return False
    ids = req.fill_ids
    m = tree.match_prefix(ids[: req.max_cacheable_prefix()], req.cache_salt)
    cached = len(m.pages) * page_size
    for other in admitted:
        if other.cache_salt != req.cache_salt:
            continue
        o = other.fill_ids
        n, lim = cached, min(len(ids), len(o)) - 1
        while n < lim and ids[n] == o[n]:
            n += 1
        if n - cached >= max(IN_BATCH_SHARE_MIN, page_size):
            return True
    return False
