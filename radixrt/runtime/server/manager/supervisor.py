"""Keeps the children of ``radixrt serve`` alive: when the scheduler, the detokenizer or a ``--tp`` rank
dies, every in-flight request ends at once with a 503 naming the process and its exit code, and both
children are started again with the same arguments (the model is loaded again).

- Death is seen without polling: the event loop watches each child's sentinel fd
  (:mod:`.child_processes`); a ``--tp`` rank's death ends the scheduler process, which leaves a note
  naming the rank, its pid and its exit code (``ChildProcesses.note``).
- A restart replaces both children, the ``ipc://`` folder and the main process's ZMQ sockets: nothing
  queued for, or half-sent to, a dead process can reach its successor. Restarting the detokenizer alone
  would leave the scheduler's in-flight outputs without a reader, so a dead detokenizer costs the radix
  cache too (a scheduler loads the default model in seconds).
- While the children come back ``tm.dead`` holds the reason: ``/health`` and every call answer 503; the
  ReadyOut of the new scheduler clears it. Open sessions lived in the dead scheduler: they are reported
  closed (dropped from the open set, logged; a later use is a 400 "no open session").
- Restarts are rate-limited: at most ``--max-restarts`` in any :data:`WINDOW_S` seconds; one more death
  leaves the server down (``/health`` 503) with one error line in the log saying so.
- Counted in ``/metrics`` as ``radixrt:process_restarts_total{process}`` and in ``/get_server_info``'s
  ``restarts``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from typing import Optional

from radixrt.runtime.io_struct import ReadyOut
from radixrt.runtime.server.manager.child_processes import ChildProcesses
from radixrt.runtime.server.manager.ipc import Ipc

logger = logging.getLogger("radixrt.server")
WINDOW_S = 600.0  # the --max-restarts window: 10 min
SIGNAL_GRACE_S = 0.5  # a child killed by SIGTERM/SIGINT: how long to wait for the server's own drain


class Supervisor:
    """Starts the children of a TokenizerManager ``tm`` and restarts them when one dies.

    ``restarts`` maps the name of the process that died (``scheduler``, ``detokenizer``, ``tp_rank``) to
    how many times that caused a restart.
    """

    def __init__(self, tm):
        self.tm = tm
        self.restarts: dict[str, int] = {}
        self.times: deque[float] = deque()  # monotonic seconds of the restarts within WINDOW_S
        self.recv_task: Optional[asyncio.Task] = None
        self.t_died: Optional[float] = None  # monotonic seconds of the last death (restart latency)
        self.generation = 0  # children started so far, minus one
        self.down = False  # gave up (rate limit or a failed reload): stays down
        self._task: Optional[asyncio.Task] = None

    def spawn(self) -> None:
        """Bind fresh IPC sockets in a fresh folder, start both children and the receive loop. The first
        time, children that ``radixrt serve`` started before its HTTP set-up (``tm.children``) are adopted."""
        tm = self.tm
        early = tm.children if self.generation == 0 else None
        children = early if early is not None else ChildProcesses(tm.args)
        tm.connect(children, Ipc(children.addr["scheduler"], children.addr["main"]))
        if not children.procs:
            children.spawn()
        children.watch(lambda name: self._on_exit(children, name))
        self.recv_task = tm.spawn_task(tm.ipc.recv_loop(tm.dispatch, self._on_ready), name="radixrt-recv")

    def _on_ready(self, r: ReadyOut) -> None:
        if self.generation == 0:  # the first start: the TokenizerManager finishes its own set-up
            self.tm.spawn_task(self.tm.on_ready(r))
        elif r.error is not None:
            self._give_up(f"{self.tm.dead}; the restarted scheduler failed to load the model: {r.error}")
        else:
            logger.warning("the children are back after %.1f s; serving again", time.monotonic() - self.t_died)
            self.tm.revive()

    def _on_exit(self, children: ChildProcesses, name: str, deferred: bool = False, code: int | None = None) -> None:
        """A child's sentinel fired (in the event loop); ``deferred``: called again after SIGNAL_GRACE_S with the
        exit ``code`` already reaped."""
        tm = self.tm
        if children is not tm.children:  # a child of a generation already replaced
            return
        if not deferred:
            code = children.reap(name)
        if tm.closing or self.down:
            return
        if code in (-signal.SIGTERM, -signal.SIGINT) and not deferred:
            # a signal to the whole process group (Ctrl-C, a container stop) reaches the children first: give
            # the main process's own handler a moment to start the drain before calling this a crash
            asyncio.get_running_loop().call_later(SIGNAL_GRACE_S, self._on_exit, children, name, True, code)
            return
        if deferred and tm.admission.draining is not None:
            # its requests cannot finish now: end them at once (503 naming the process) rather than at the
            # drain timeout
            msg = f"the {name} process stopped on signal {-code} while the server shuts down"
            logger.info("%s", msg)
            tm.fail(msg)
            return
        note = children.note() if name == "scheduler" else None
        what = f"the {name} process exited unexpectedly (exit code {code}" + (f": {note})" if note else ")")
        if tm.ready is None or not tm.ready.is_set():  # died during the first start: nothing to go back to
            tm.set_fatal(f"{what}; restart the server")
            return
        cause = "tp_rank" if note and "tensor-parallel rank" in note else name
        now = time.monotonic()
        while self.times and now - self.times[0] > WINDOW_S:
            self.times.popleft()
        self.t_died = now
        self._close_sessions()
        if tm.args.tp > 1 and "WORLD_SIZE" in os.environ:  # torchrun's ranks are not ours to start again
            tm.fail(f"{what}; not restarted")
            self._give_up(
                f"{what}; not restarted: the --tp ranks were started by torchrun; "
                f"the server stays down until it is restarted"
            )
            return
        if len(self.times) >= tm.args.max_restarts:
            tm.fail(f"{what}; not restarted")
            why = (
                f"{len(self.times)} restarts in the last {WINDOW_S / 60:.0f} min reached --max-restarts "
                f"{tm.args.max_restarts}"
                if tm.args.max_restarts
                else "--max-restarts 0"
            )
            self._give_up(f"{what}; not restarted: {why}; the server stays down until it is restarted")
            return
        self.times.append(now)
        self.restarts[cause] = self.restarts.get(cause, 0) + 1
        if tm.metrics is not None:
            tm.metrics.observe_restart(cause)
        tm.fail(f"{what}; restarting it, retry when GET /health returns 200", newer=True)
        logger.error(
            "%s; restarting the children (%d of at most %d in %.0f min)",
            what,
            len(self.times),
            tm.args.max_restarts,
            WINDOW_S / 60,
        )
        self._task = asyncio.create_task(self._restart(children))

    def _close_sessions(self) -> None:
        tm = self.tm
        if tm.session_ids:
            logger.warning("sessions closed with the scheduler that held them: %s", sorted(tm.session_ids))
            tm.session_ids.clear()

    async def _restart(self, old: ChildProcesses) -> None:
        tm = self.tm
        old.unwatch()  # the survivor is stopped on purpose: its exit is not another death
        if self.recv_task is not None:
            self.recv_task.cancel()
        tm.ipc.close()
        tm.early_aborts.clear()
        await asyncio.to_thread(old.stop)
        if tm.closing:
            return
        self.generation += 1
        self.spawn()

    def _give_up(self, msg: str) -> None:
        self.down = True
        self.tm.fail(msg, newer=True)
        logger.error("%s", msg)
        if self.tm.children is not None:
            self.tm.children.unwatch()
