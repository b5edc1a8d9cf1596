"""KV memory: the paged K/V tensors (``kv_pool``), free pages (``allocator``), the radix tree that owns
every cached page (``radix_cache``, with ``eviction`` policies LRU/LFU/GDSF and ``tree_check``), and a
request's own pages (``req_pages``: admit, grow, cache, release). The allocator knows pages, not
requests. Invariant: free + evictable + protected (+ private while busy) = total pages. Imports nothing
else of radixrt.
"""
from radixrt.runtime.mem.allocator import PageAllocator
from radixrt.runtime.mem.kv_pool import KVPool
from radixrt.runtime.mem.radix_cache import MatchResult, RadixCache, TreeNode
from radixrt.runtime.mem.req_pages import ReqPages

__all__ = ["KVPool", "MatchResult", "PageAllocator", "RadixCache", "ReqPages", "TreeNode"]
