"""The chained 63-bit page hash: one hash per whole page of token ids, each covering its page's tokens and
the hash of the page before, so equal hashes mean equal prefixes (vLLM's block hashes work the same way).

The request log (``--request-log-hash``) writes these hashes, and the cache tiers under the radix tree
(``hicache.py``) key evicted pages by them: the hash of a page names the whole prefix that produced its KV.
"""

from __future__ import annotations

import hashlib
import struct

HASH_MASK = (1 << 63) - 1


def page_hashes(ids: list[int], page_size: int) -> list[int]:
    """One hash per whole page of ``ids`` (a trailing partial page gets none). BLAKE2b over the previous
    page's 8-byte digest and the page's ids as little-endian int64, 8-byte digest, top bit cleared so it
    stays a non-negative JSON integer. Raises ValueError when ``page_size`` < 1."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    out, prev = [], b""
    for i in range(len(ids) // page_size):
        page = ids[i * page_size : (i + 1) * page_size]
        prev = hashlib.blake2b(prev + struct.pack(f"<{len(page)}q", *page), digest_size=8).digest()
        out.append(int.from_bytes(prev, "little") & HASH_MASK)
    return out
