"""The scheduler and detokenizer child processes of ``radixrt serve``, and the IPC folder they talk through.

Both are started with multiprocessing's "spawn" context (no inherited state, no fork of a process that
holds ZMQ sockets and threads). ServerArgs travel as msgspec JSON, without the API key. The children poll
the main process's pid and exit on their own when it dies; :meth:`ChildProcesses.stop` is the orderly way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

import msgspec

from radixrt.runtime.config import ServerArgs

ENDPOINTS = ("scheduler", "detokenizer", "main")  # who binds each: main binds scheduler+main, the detokenizer its own


class ChildProcesses:
    """Owns the children and the private ``ipc://`` folder. ``addr[name]`` is each endpoint's address."""

    def __init__(self, args: ServerArgs):
        self.args = args
        self.procs: dict[str, Any] = {}
        self.ipc_dir: Optional[str] = tempfile.mkdtemp(prefix="radixrt-")
        self.addr = {n: f"ipc://{os.path.join(self.ipc_dir, n)}" for n in ENDPOINTS}
        # the scheduler writes why it stops here when a --tp rank died (its own exit code only says 1)
        self.exit_note = os.path.join(self.ipc_dir, "scheduler.exit")
        self._watched: set[str] = set()

    def start(self, on_exit: Callable[[str], None]) -> None:
        """Spawn both children; ``on_exit(name)`` runs in the event loop when one of them exits."""
        self.spawn()
        self.watch(on_exit)

    def spawn(self) -> None:
        """Start both children (no event loop needed: ``radixrt serve`` starts them before its HTTP set-up,
        so the model loads meanwhile). They connect to the main process's endpoints before it binds them:
        ZMQ retries the connection, and what they send waits in their queue."""
        from radixrt.runtime.tokenizer.detokenizer_process import run_detokenizer_process
        from radixrt.runtime.scheduler.process import run_scheduler_process

        spawn = mp.get_context("spawn")
        child_args = msgspec.json.encode(dataclasses.replace(self.args, api_key=None))
        pid = os.getpid()
        self.procs["scheduler"] = spawn.Process(
            target=run_scheduler_process,
            name="radixrt-scheduler",
            daemon=True,
            args=(child_args, self.addr["scheduler"], self.addr["detokenizer"], pid, self.exit_note),
        )
        self.procs["detokenizer"] = spawn.Process(
            target=run_detokenizer_process,
            name="radixrt-detokenizer",
            daemon=True,
            args=(self.args.model, self.args.log_level, self.addr["detokenizer"], self.addr["main"], pid),
        )
        for p in self.procs.values():
            p.start()

    def watch(self, on_exit: Callable[[str], None]) -> None:
        """``on_exit(name)`` runs in the event loop when child ``name`` exits (at once if it already has)."""
        loop = asyncio.get_running_loop()
        for name, p in self.procs.items():
            # the sentinel fd becomes readable when the process ends: death is seen without any polling
            loop.add_reader(p.sentinel, on_exit, name)
            self._watched.add(name)

    def reap(self, name: str) -> Optional[int]:
        """Stop watching child ``name`` (it exited) and return its exit code."""
        p = self.procs[name]
        if name in self._watched:
            self._watched.discard(name)
            asyncio.get_running_loop().remove_reader(p.sentinel)
        # the sentinel fires as the process closes its fds, a moment before it becomes a zombie to reap
        p.join(timeout=2)
        return p.exitcode

    def unwatch(self) -> None:
        """Stop watching every child (before stopping the survivors on purpose). Call in the event loop."""
        loop = asyncio.get_running_loop()
        for name in self._watched:
            loop.remove_reader(self.procs[name].sentinel)
        self._watched.clear()

    def note(self) -> Optional[str]:
        """What the scheduler wrote before exiting (a dead --tp rank, its pid and exit code), or None."""
        try:
            with open(self.exit_note) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the children (SIGTERM, then SIGKILL after ``timeout`` seconds) and remove the IPC
        folder. Idempotent and synchronous (also called after the event loop has ended)."""
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.time() + timeout
        for p in self.procs.values():
            p.join(timeout=max(deadline - time.time(), 0.1))
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None
