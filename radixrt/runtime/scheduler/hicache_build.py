"""Set-up of the cache tiers under the radix tree (``mem/hicache.py``) from the server's flags, and the
model fingerprint that keeps tier 3's files apart per model.

Flags (SGLang's names): ``--enable-hierarchical-cache`` or ``--hicache-size GB`` (host store; 0 with the
former: ``--hicache-ratio`` x the pool), ``--hicache-storage file:DIR`` (tier 3, turns the tiers on),
``--hicache-write-policy write_through|write_back``, ``--hicache-prefetch-threshold`` (tokens),
``--hicache-storage-size GB`` (a bound on tier 3's files; 0: none).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from radixrt.runtime.executor.memory import available_bytes
from radixrt.runtime.mem.disk_tier import DiskTier
from radixrt.runtime.mem.hicache import HiCache
from radixrt.runtime.mem.host_tier import HostTier
from radixrt.runtime.mem.page_codec import PageCodec

_SAMPLE = 1 << 20  # bytes read from each end of a weight file


def hicache_enabled(args) -> bool:
    return bool(args.enable_hierarchical_cache or args.hicache_size > 0 or args.hicache_storage)


def weight_files(source) -> list[str]:
    """The files the weights come from: the GGUF, or a directory's config.json and *.safetensors."""
    if source.gguf_file is not None:
        return [os.path.join(source.directory, source.gguf_file)]
    names = sorted(f for f in os.listdir(source.directory) if f.endswith(".safetensors"))
    return [os.path.join(source.directory, f) for f in ["config.json", *names]]


def model_fingerprint(runner) -> bytes:
    """16 bytes naming what a page's KV depends on: the weight files (size and their first and last MiB,
    which hold a GGUF's or safetensors' header and the last tensors' bytes), the weight format as run, the
    activation and KV dtypes and the page size. Reads at most 2 MiB per file."""
    h = hashlib.blake2b(digest_size=16)
    for path in weight_files(runner.source):
        size = os.path.getsize(path)
        h.update(f"{os.path.basename(path)}:{size}:".encode())
        with open(path, "rb") as f:
            h.update(f.read(_SAMPLE))
            f.seek(max(size - _SAMPLE, 0))
            h.update(f.read(_SAMPLE))
    h.update(f"|{runner.quantization}|{runner.dtype}|{runner.kv_dtype_name}|{runner.page_size}".encode())
    return h.digest()


def make_hicache(args, runner) -> Callable[[Any, Callable], HiCache] | None:
    """What builds the tiers for a scheduler's ``ReqPages`` (its ``tiers`` argument: the tree and
    ``ReqPages.allocate`` in, a ``HiCache`` with copy threads out), or None when the flags leave them off.
    The host tier's memory and tier 3's directory are taken here.

    Raises:
        ValueError: tiers asked for without the radix cache, under ``--tp``, or a bad storage spec.
        OSError: the storage directory cannot be created.
    """
    if not hicache_enabled(args):
        return None
    if args.disable_radix_cache:
        raise ValueError("enable_hierarchical_cache needs the radix cache (drop --disable-radix-cache)")
    if args.tp > 1:
        raise ValueError("enable_hierarchical_cache is not supported with --tp > 1")
    codec = PageCodec(runner.kv)
    if args.hicache_size > 0:
        slots = int(args.hicache_size * 2**30) // codec.page_bytes
    else:
        slots = int(args.hicache_ratio * runner.num_pages)
    need, avail = slots * codec.page_bytes, available_bytes()
    if need > avail:  # a clear refusal instead of numpy's MemoryError from deep inside the allocation
        flag = "hicache_size" if args.hicache_size > 0 else "hicache_ratio"
        raise ValueError(
            f"{flag}: a host tier of {need / 2**30:.2f} GB is more than the {avail / 2**30:.2f} GB of memory available"
        )
    disk = None
    if args.hicache_storage:
        pool = runner.kv
        shape = (runner.kv_dtype_name, runner.page_size, len(pool.k), pool.k[0].shape[2], pool.k[0].shape[3])
        disk = DiskTier(
            args.hicache_storage[len("file:") :],
            model_fingerprint(runner),
            shape,
            codec.page_bytes,
            int(args.hicache_storage_size * 2**30),
        )
    policy, threshold = args.hicache_write_policy, args.hicache_prefetch_threshold

    def tiers(tree, allocate):
        host = HostTier(slots, codec.page_bytes, on_drop=tree.policy.dropped)
        return HiCache(tree, codec, allocate, host, disk, policy, threshold, copy_threads=True)

    return tiers
