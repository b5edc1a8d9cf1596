"""A thread-pool cache of compiled grammars, so the scheduler loop never blocks on compilation.

``submit`` returns a ``concurrent.futures.Future`` at once; the scheduler polls ``future.done()`` each step
and admits the request once it is (SGLang's "grammar queue"). Entries are keyed by
``(kind, spec text, any_whitespace)``; a failed compile is cached too, so a bad spec sent again fails
fast with the same ValueError.

The backend itself may be built on a thread too (:meth:`GrammarCache.building`): the scheduler then reports
ready without waiting for it (llguidance's tokenizer import, seconds at a large vocabulary), and a compile
submitted before it is built waits for it on its compile thread. With ``start=False`` the build waits for
:meth:`GrammarCache.start` or the first compile (the server starts it once idle after ready: on few cores
a build beside the load or the first requests delays their tokens by its CPU time and its hold on the GIL).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from .base import CompiledGrammar, GrammarBackend, reraise_fatal


@dataclass
class CacheStats:
    """Counters, updated under the cache's lock."""

    hits: int = 0
    misses: int = 0
    failures: int = 0
    evictions: int = 0


class GrammarCache:
    """Compiles on a ``ThreadPoolExecutor`` and memoizes the futures; all methods are thread-safe.

    Args:
        backend: the grammar backend (its ``compile`` must be thread-safe; both shipped ones are).
        max_workers: compile threads.
        max_entries: least recently used finished entries beyond this are dropped.
    """

    def __init__(self, backend: GrammarBackend | None, max_workers: int = 2, max_entries: int = 1024):
        self.max_entries = max_entries
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, Future] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._backend: Future = Future()
        self._pending: tuple | None = None  # (factory, name) of a build not started yet
        if backend is not None:
            self._backend.set_result(backend)

    @classmethod
    def building(
        cls,
        factory: Callable[[], GrammarBackend],
        name: str,
        max_workers: int = 2,
        max_entries: int = 1024,
        start: bool = True,
    ) -> "GrammarCache":
        """A cache whose backend ``factory()`` runs on a thread of its own (a compile waits for it on the
        pool, ``max_workers`` >= 2); returns at once. ``name``: the backend's name, for a failed build's error.
        A build that raises makes every compile raise ``ValueError`` naming ``name`` and the cause.
        ``start=False``: the build waits for :meth:`start`, or the first :meth:`submit`."""
        if max_workers < 2:
            raise ValueError(f"max_workers: a backend built on the pool needs >= 2 threads, got {max_workers}")
        cache = cls(None, max_workers, max_entries)
        cache._pending = (factory, name)
        if start:
            cache.start()
        return cache

    def start(self) -> None:
        """Start the build of a cache made with ``building(start=False)``; no effect after the first call or
        on a cache made with its backend. Its own thread, not the pool's: compiles may already hold every
        pool thread, each waiting for the backend."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            threading.Thread(target=self._build, args=pending, name="grammar-backend", daemon=True).start()

    def _build(self, factory: Callable[[], GrammarBackend], name: str) -> None:
        try:
            self._backend.set_result(factory())
        except BaseException as e:  # noqa: BLE001 - every compile then says why (none waits forever)
            self._backend.set_exception(ValueError(f"{name}: grammar backend set-up failed: {type(e).__name__}: {e}"))

    @property
    def backend(self) -> GrammarBackend:
        """The backend (blocks until it is built). Raises ValueError where its build failed."""
        return self._backend.result()

    def _compile(self, key: tuple, kind: str, spec: str, any_whitespace: bool) -> CompiledGrammar:
        try:  # self.backend waits for a backend built on the pool; a failed build raises its ValueError
            return self.backend.compile(kind, spec, any_whitespace)
        except ValueError:
            with self._lock:
                self.stats.failures += 1
            raise
        except BaseException as e:  # a backend bug must still reach the caller as a clear error
            reraise_fatal(e)
            with self._lock:
                self.stats.failures += 1
            raise ValueError(f"{self.backend.name}: cannot compile {kind}: {type(e).__name__}: {e}") from e

    def submit(self, kind: str, spec: str, any_whitespace: bool = False) -> Future:
        """A future resolving to the ``CompiledGrammar`` or raising ``ValueError``; never blocks.

        The same ``(kind, spec, any_whitespace)`` gets the same future (and so the same object) back.
        """
        key = (kind, spec, bool(any_whitespace))
        if self._pending is not None:  # a compile needs the backend now
            self.start()
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return fut
            self.stats.misses += 1
            fut = self._pool.submit(self._compile, key, kind, spec, bool(any_whitespace))
            self._entries[key] = fut
            self._evict_locked()
            return fut

    def get(self, kind: str, spec: str, any_whitespace: bool = False, timeout: float | None = None) -> CompiledGrammar:
        """Blocking convenience: ``submit(...).result(timeout)``. Raises ValueError on a bad spec."""
        return self.submit(kind, spec, any_whitespace).result(timeout)

    def _evict_locked(self) -> None:
        excess = len(self._entries) - self.max_entries
        if excess <= 0:
            return
        for key in [k for k, f in self._entries.items() if f.done()][:excess]:
            del self._entries[key]
            self.stats.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every finished entry (running compiles stay)."""
        with self._lock:
            for key in [k for k, f in self._entries.items() if f.done()]:
                del self._entries[key]

    def shutdown(self, wait: bool = True) -> None:
        """Stop the compile threads (pending compiles are cancelled when ``wait`` is False)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
