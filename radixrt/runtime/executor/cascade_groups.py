"""Group a step's decode rows by the radix-tree prefix their requests hold (for cascade attention).

Every running request locks the radix node that ends its tree-owned prefix (``req.last_node``); the
node's path from the root is the chain of cached ranges whose pages the request shares with every other
request below the same nodes. A maximal run of path nodes with the same set of decode rows becomes one
group when it is shared by at least ``min_rows`` rows and spans at least ``min_tokens`` tokens (counted
from the end of the enclosing group); a shorter run is left to the next group below it or to the
rows' own suffixes. Groups below a group are its next level, so nested prefixes (a system prompt, then a
few-shot block shared by a subset) each get read once.

Cost: O(rows x path depth) dictionary work per step, no page or token loops.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.kernels.attention.prefix_groups import PrefixGroups

DEFAULT_MIN_TOKENS = 64
DEFAULT_MIN_ROWS = 2


def group_decode_rows(
    nodes: Sequence,
    page_tables: Sequence[Sequence[int]],
    q_lens: Sequence[int],
    page_size: int,
    min_tokens: int = DEFAULT_MIN_TOKENS,
    min_rows: int = DEFAULT_MIN_ROWS,
) -> PrefixGroups | None:
    """Prefix groups of a batch, from each request's locked radix node.

    Args:
        nodes: per batch row, the radix ``TreeNode`` ending its tree-owned prefix (``req.last_node``), or
            None (no cached prefix, or the cache is off). Only ``parent`` and ``value`` are read.
        page_tables: per batch row, its page ids (the first pages are the tree's, along ``nodes``' path).
        q_lens: per batch row, new tokens this step; only rows with 1 (decodes) are grouped.
        page_size: tokens per page.
        min_tokens: a group's range must span at least this many tokens.
        min_rows: a group must have at least this many rows (>= 1).

    Returns:
        The groups, or None when no rows share a long enough prefix.

    Raises:
        ValueError: ``nodes``, ``page_tables`` and ``q_lens`` differ in length, or ``min_rows < 1``.
    """
    if not len(nodes) == len(page_tables) == len(q_lens):
        raise ValueError("nodes, page_tables and q_lens must have one entry per batch row")
    if min_rows < 1:
        raise ValueError(f"min_rows must be >= 1, got {min_rows}")
    if len(nodes) < min_rows:  # too few rows for any group (batch 1 at the default): skip the walk
        return None
    paths: list[list] = []
    members: dict[int, list[int]] = {}  # id(node) -> decode rows below it, ascending
    for i, node in enumerate(nodes):
        path = []
        if q_lens[i] == 1:
            while node is not None and node.parent is not None:
                path.append(node)
                node = node.parent
            path.reverse()
            for n in path:
                members.setdefault(id(n), []).append(i)
        paths.append(path)
    out = PrefixGroups([], [], [], [], [], [0] * len(nodes))
    index: dict[int, int] = {}  # id(node) -> its group
    for i, path in enumerate(paths):
        start = end = level = 0
        for j, n in enumerate(path):
            end += len(n.value) * page_size
            rows = members[id(n)]
            chain_ends = j + 1 == len(path) or len(members[id(path[j + 1])]) != len(rows)
            if not chain_ends or len(rows) < min_rows or end - start < min_tokens:
                continue
            if id(n) not in index:
                index[id(n)] = out.num_groups
                out.rows.append(rows)
                out.starts.append(start)
                out.ends.append(end)
                out.pages.append(list(page_tables[i][start // page_size : end // page_size]))
                out.levels.append(level)
            start, level = end, level + 1
        out.suffix_starts[i] = start
    return out if out.num_groups else None
