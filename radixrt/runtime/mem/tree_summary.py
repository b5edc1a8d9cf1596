"""What the radix tree holds, for ``GET /cache_tree`` and the dashboard: its longest and most-hit prefixes.

Each prefix is a node's whole path from its root: ``tokens`` (its length), ``node_tokens`` (the node's own
edge), ``hits`` (admissions matched through it), ``lock_ref`` (requests holding it), ``salted`` (a
``cache_salt`` namespace; the salt itself is not shown), and ``head_ids``: the prefix's first token ids,
for the caller to decode. O(nodes) per call; it runs in the scheduler between steps.
"""

from __future__ import annotations

from typing import Any


def summarize_tree(tree: Any, top: int, head_tokens: int = 24) -> dict:
    """``{"num_nodes", "largest": [...], "most_hit": [...]}`` with at most ``top`` prefixes in each list
    (``tree``: a ``RadixCache``). ``largest`` is ordered by length, ``most_hit`` by hits then length."""
    rows: list[dict] = []
    for salt, root in tree.roots.items():
        stack = [(child, 0, []) for child in root.children.values()]
        while stack:
            node, depth, head = stack.pop()
            end = depth + len(node.key)
            head = head if len(head) >= head_tokens else head + node.key[: head_tokens - len(head)]
            rows.append(
                {
                    "tokens": end,
                    "node_tokens": len(node.key),
                    "hits": node.hit_count,
                    "lock_ref": node.lock_ref,
                    "salted": salt is not None,
                    "head_ids": head,
                }
            )
            stack.extend((c, end, head) for c in node.children.values())
    largest = sorted(rows, key=lambda r: (-r["tokens"], -r["hits"]))[:top]
    most_hit = sorted(rows, key=lambda r: (-r["hits"], -r["tokens"]))[:top]
    return {"num_nodes": len(rows), "largest": largest, "most_hit": most_hit}
