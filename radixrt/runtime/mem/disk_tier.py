"""Tier 3: KV pages in files (``--hicache-storage file:DIR``), so the cache outlives the process.

One file per page, named by its content key: BLAKE2b of the model fingerprint, the ``cache_salt``, the
page's chained hash (``page_hash.py``), the KV element type and the page size. The file is a fixed header
(``struct``, no pickle) and the page's row of bytes (``page_codec.py``):

    magic "RXKV", version u16, dtype code u8, pad, page_size u32, num_layers u32, num_kv_heads u32,
    head_dim u32, fingerprint 16 B, salt digest 8 B, page hash u64, payload length u64, payload BLAKE2b 16 B

A read checks every field against what this server expects and the payload's digest against its bytes;
a file that fails (corrupt, truncated, another model's, another tenant's) is deleted with a warning and
the page is recomputed, so it never reaches attention. The directory is created 0700 and files 0600.
Files are written by one background thread (a temporary name, then ``os.replace``, so a reader never sees
half a file); the bytes are copied out of the pool before they are queued.

At start the same thread first scrubs the directory (a server killed mid-write, a disk that lost bytes):
every file of this model is checked whole (header, its name against the header, length, digest) and a bad
one is deleted with a warning naming it; a temporary file whose writing process is gone is deleted too.
Files of another model (another fingerprint) are left alone: several servers may share a directory.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import queue
import struct
import threading
import time

logger = logging.getLogger(__name__)

MAGIC, VERSION = b"RXKV", 1
HEADER = struct.Struct("<4sHBxIIII16s8sQQ16s")
DTYPE_CODES = {"fp32": 1, "fp16": 2, "bf16": 3, "int8": 4}


def salt_digest(salt: str | None) -> bytes:
    """8 bytes naming a cache namespace (zeros for the default one)."""
    return bytes(8) if salt is None else hashlib.blake2b(b"salt:" + salt.encode(), digest_size=8).digest()


class DiskTier:
    """Pages under ``directory``; ``fingerprint`` (16 bytes) names the model and its KV layout.

    Args:
        shape: ``(dtype name, page_size, num_layers, num_kv_heads, head_dim)`` of the pool.
        page_bytes: the row length every file's payload must have.
        max_bytes: a bound on the directory's page files (``--hicache-storage-size``; 0: none). Past it the
            least recently written or read file goes (LRU: the tree's scores die with the process, the files
            do not; at start, files rank by modification time).

    Raises:
        ValueError: a fingerprint that is not 16 bytes, or an unknown dtype name.
        OSError: the directory cannot be created.
    """

    def __init__(self, directory: str, fingerprint: bytes, shape: tuple, page_bytes: int, max_bytes: int = 0) -> None:
        if len(fingerprint) != 16:
            raise ValueError("the model fingerprint must be 16 bytes")
        if shape[0] not in DTYPE_CODES:
            raise ValueError(f"kv_cache_dtype {shape[0]!r} cannot be stored on disk")
        self.dir, self.fingerprint, self.page_bytes = os.path.abspath(directory), fingerprint, page_bytes
        self.dtype_code = DTYPE_CODES[shape[0]]
        self.shape = tuple(shape[1:])
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)  # makedirs leaves an existing directory's mode alone
        found = [
            (os.stat(os.path.join(self.dir, n)).st_mtime, n[:-3]) for n in os.listdir(self.dir) if n.endswith(".kv")
        ]
        self.known: set[str] = {n for _, n in found}
        self.max_files = max_bytes // (HEADER.size + page_bytes) if max_bytes > 0 else 0
        if max_bytes > 0 and self.max_files < 1:
            raise ValueError(f"hicache_storage_size ({max_bytes} bytes) holds no page of {HEADER.size + page_bytes}")
        self._lru: collections.OrderedDict[str, None] = collections.OrderedDict((n, None) for _, n in sorted(found))
        self.evicted_files = 0
        self.written = self.read_pages = self.dropped = self.recreated = 0
        self.bytes_written = self.bytes_read = 0
        self.write_seconds = self.read_seconds = 0.0
        self._queue: queue.Queue = queue.Queue()
        self._pending = 1  # the scrub: flush() waits for it too
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._writer, name="hicache-disk", daemon=True)
        self._thread.start()

    def name(self, salt: str | None, page_hash: int) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(self.fingerprint + salt_digest(salt) + struct.pack("<QBI", page_hash, self.dtype_code, self.shape[0]))
        return h.hexdigest()

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name + ".kv")

    def __contains__(self, key: tuple) -> bool:
        return self.name(*key) in self.known

    @property
    def pending_writes(self) -> int:
        with self._lock:
            return self._pending

    def write(self, salt: str | None, page_hash: int, row: bytes) -> bool:
        """Queue one page for writing (skipped when a file for it exists). Returns True when queued."""
        name = self.name(salt, page_hash)
        if name in self.known:
            return False
        self.known.add(name)
        self._touch(name)
        header = HEADER.pack(
            MAGIC,
            VERSION,
            self.dtype_code,
            *self.shape,
            self.fingerprint,
            salt_digest(salt),
            page_hash,
            len(row),
            hashlib.blake2b(row, digest_size=16).digest(),
        )
        with self._lock:
            self._pending += 1
        self._queue.put((name, header + row))
        while self.max_files and len(self._lru) > self.max_files:
            with self._lock:
                old, _ = self._lru.popitem(last=False)
            self.known.discard(old)
            self.evicted_files += 1
            with self._lock:
                self._pending += 1
            self._queue.put((old, None))  # deleted by the writer, after any queued write of it
        return True

    def _touch(self, name: str) -> None:
        """``name`` was just written or read: last to be evicted."""
        with self._lock:
            self._lru[name] = None
            self._lru.move_to_end(name)

    def _forget(self, name: str) -> None:
        self.known.discard(name)
        with self._lock:
            self._lru.pop(name, None)

    def _writer(self) -> None:
        try:
            self._scrub()
        except OSError as e:  # an unreadable directory: reads check each file anyway
            logger.warning("hicache: could not scrub %s: %s", self.dir, e)
        finally:
            with self._lock:
                self._pending -= 1
        while True:
            item = self._queue.get()
            if item is None:
                return
            name, data = item
            if data is None:  # evicted past --hicache-storage-size
                try:
                    os.unlink(self.path(name))
                except OSError:
                    pass
                with self._lock:
                    self._pending -= 1
                continue
            t0 = time.perf_counter()
            try:
                try:
                    self._write_file(name, data)
                except FileNotFoundError:  # the directory was deleted under us: make it again (0700), retry
                    logger.warning("hicache: %s is gone; creating it again", self.dir)
                    os.makedirs(self.dir, mode=0o700, exist_ok=True)
                    os.chmod(self.dir, 0o700)
                    self.recreated += 1
                    self._write_file(name, data)
                    self._resync()
                self.written += 1
                self.bytes_written += len(data)
            except OSError as e:  # a full disk loses the page, not the server
                logger.warning("hicache: could not write %s: %s", self.path(name), e)
                self._forget(name)
            finally:
                self.write_seconds += time.perf_counter() - t0
                with self._lock:
                    self._pending -= 1

    def _resync(self) -> None:
        """The directory was made again (writer thread): forget the files that went with the old one, which
        ``disk.files`` still counted, keeping those on disk and those whose writes are queued."""
        with self._queue.mutex:
            queued = {item[0] for item in self._queue.queue if item is not None and item[1] is not None}
        keep = queued | {n[:-3] for n in os.listdir(self.dir) if n.endswith(".kv")}
        for name in list(self.known):  # list(set) copies in one step: the scheduler thread may add meanwhile
            if name not in keep:
                self._forget(name)

    def _scrub(self) -> None:
        """Delete what a crash or a bad disk left: this model's files that fail a check, and temporary
        files (``<name>.kv.tmp<pid>-<thread>``) whose process is gone."""
        for entry in os.listdir(self.dir):
            path = os.path.join(self.dir, entry)
            if ".kv.tmp" in entry:
                pid = entry.rsplit(".tmp", 1)[1].split("-")[0]
                if not (pid.isdigit() and _alive(int(pid))):
                    logger.warning("hicache: dropping %s (a write its process never finished)", path)
                    _unlink(path)
                continue
            if not entry.endswith(".kv"):
                continue
            with open(path, "rb") as f:
                data = f.read(HEADER.size + self.page_bytes + 1)
            if len(data) >= HEADER.size and HEADER.unpack_from(data)[7] != self.fingerprint:
                continue  # another model's page, checked by that model's server
            problem = self._check_file(entry[:-3], data)
            if problem is not None:
                logger.warning("hicache: dropping %s (%s)", path, problem)
                self.dropped += 1
                self._forget(entry[:-3])
                _unlink(path)

    def _check_file(self, name: str, data: bytes) -> str | None:
        """What is wrong with the file ``name`` (no salt at hand: its name must be the header's key)."""
        if len(data) < HEADER.size:
            return f"truncated header ({len(data)} bytes)"
        *_, sd, ph, _, _ = HEADER.unpack_from(data)
        h = hashlib.blake2b(digest_size=16)
        h.update(self.fingerprint + sd + struct.pack("<QBI", ph, self.dtype_code, self.shape[0]))
        if h.hexdigest() != name:
            return "its name is not its header's page"
        return self._check(data, None, ph, sd)

    def _write_file(self, name: str, data: bytes) -> None:
        tmp = self.path(name) + f".tmp{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path(name))

    def read(self, salt: str | None, page_hash: int) -> bytes | None:
        """The page's row, checked; None when there is no file or it fails a check (then it is deleted)."""
        name = self.name(salt, page_hash)
        if name not in self.known:
            return None
        t0 = time.perf_counter()
        try:
            with open(self.path(name), "rb") as f:
                data = f.read(HEADER.size + self.page_bytes + 1)
        except OSError:
            self._forget(name)
            return None
        problem = self._check(data, salt, page_hash)
        self.read_seconds += time.perf_counter() - t0
        if problem is not None:
            logger.warning("hicache: dropping %s (%s); the page is recomputed", self.path(name), problem)
            self.dropped += 1
            self._forget(name)
            try:
                os.unlink(self.path(name))
            except OSError:
                pass
            return None
        self.read_pages += 1
        self.bytes_read += len(data)
        if name in self.known:
            self._touch(name)
        return data[HEADER.size :]

    def _check(self, data: bytes, salt: str | None, page_hash: int, digest8: bytes | None = None) -> str | None:
        """What is wrong with a file's bytes, or None (``digest8``: the salt's digest, when the salt itself
        is not known)."""
        if len(data) < HEADER.size:
            return f"truncated header ({len(data)} bytes)"
        magic, version, code, ps, nl, nh, hd, fp, sd, ph, n, digest = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            return "not a radixrt KV page"
        if fp != self.fingerprint:
            return "written for another model"
        if (code, ps, nl, nh, hd) != (self.dtype_code, *self.shape):
            return "another KV dtype or layout"
        if sd != (salt_digest(salt) if digest8 is None else digest8) or ph != page_hash:
            return "another cache_salt or prefix"
        payload = data[HEADER.size :]
        if n != self.page_bytes or len(payload) != n:
            return f"payload of {len(payload)} bytes, expected {self.page_bytes}"
        if hashlib.blake2b(payload, digest_size=16).digest() != digest:
            return "payload digest mismatch"
        return None

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued page is written; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.pending_writes and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.pending_writes == 0

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        self._queue.put(None)
        self._thread.join(timeout=30)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
