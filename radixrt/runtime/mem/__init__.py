"""KV memory: the paged K/V tensors (``kv_pool``), free pages (``allocator``), the radix tree that owns
every cached page (``radix_cache``, with ``eviction`` policies LRU/LFU/GDSF and ``tree_check``), and a
request's own pages (``req_pages``: admit, grow, cache, release). The allocator knows pages, not
requests. Invariant: free + evictable + protected (+ private while busy) = total pages. Imports nothing
else of radixrt.
"""

from typing import TYPE_CHECKING

from radixrt.lazy import lazy_getattr

if TYPE_CHECKING:
    from radixrt.runtime.mem.allocator import PageAllocator
    from radixrt.runtime.mem.kv_pool import KVPool
    from radixrt.runtime.mem.radix_cache import MatchResult, RadixCache, TreeNode
    from radixrt.runtime.mem.req_pages import ReqPages

# Lazy (PEP 562): the server's main process reads ``eviction.POLICIES`` for its arguments and must not load torch
# (``kv_pool``).
_WHERE = {
    "PageAllocator": "radixrt.runtime.mem.allocator",
    "KVPool": "radixrt.runtime.mem.kv_pool",
    "MatchResult": "radixrt.runtime.mem.radix_cache",
    "RadixCache": "radixrt.runtime.mem.radix_cache",
    "TreeNode": "radixrt.runtime.mem.radix_cache",
    "ReqPages": "radixrt.runtime.mem.req_pages",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


__all__ = ["KVPool", "MatchResult", "PageAllocator", "RadixCache", "ReqPages", "TreeNode"]
