"""The radix cache's invariants (listed in ``radix_cache.py``), checked by walking the whole tree. Tests call
this after every step; it is O(tree) and never runs on the serving path."""

from __future__ import annotations

from typing import Any


def check_tree(cache: Any) -> None:
    """Raise AssertionError naming the first broken invariant of ``cache`` (a ``RadixCache``; not imported,
    as it imports this module)."""

    def fail(msg: str) -> None:
        raise AssertionError(f"RadixCache invariant broken: {msg}")

    ps = cache.page_size
    key = cache.policy.key
    evictable = protected = 0
    seen: set[int] = set()
    for salt, root in cache.roots.items():
        if root.parent is not None or root.key or root.value or root.lock_ref != 0:
            fail(f"root for salt {salt!r} is not a bare root: {root!r}")
    for node in cache.nodes():
        parent = node.parent
        if parent is None:
            fail(f"{node!r} has no parent")
            return
        if not node.value or len(node.key) != len(node.value) * ps:
            fail(f"{node!r}: {len(node.key)} tokens vs {len(node.value)} pages x {ps}")
        if parent.children.get(tuple(node.key[:ps])) is not node:
            fail(f"{node!r} is not its parent's child under its first page")
        if node.lock_ref < 0:
            fail(f"{node!r} has negative lock_ref")
        child_locks = sum(c.lock_ref for c in node.children.values())
        if node.lock_ref < child_locks:
            fail(f"{node!r} lock_ref < its children's total {child_locks}")
        if parent.parent is not None and (
            parent.last_access_time < node.last_access_time
            or parent.hit_count < node.hit_count
            or key(parent) < key(node)
        ):
            fail(f"{node!r} was accessed, hit or scored after its parent {parent!r}")
        for page in node.value:
            if page in seen or not 0 <= page < cache.allocator.num_pages:
                fail(f"page {page} is duplicated or out of range (in {node!r})")
            seen.add(page)
        if node.lock_ref == 0:
            evictable += len(node.value)
        else:
            protected += len(node.value)
    if (evictable, protected) != (cache.evictable_pages, cache.protected_pages):
        fail(
            f"counters evictable={cache.evictable_pages} protected={cache.protected_pages}, "
            f"tree has evictable={evictable} protected={protected}"
        )
