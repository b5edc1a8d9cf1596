"""Tensor-parallel schedulers in lockstep: one scheduler per rank, rank 0 alone talks ZeroMQ.

Every rank holds the same requests, the same radix tree and the same page tables (only its slice of the
weights and of the KV heads differs), so every rank's scheduler makes the same decisions as long as it sees
the same inputs in the same order. Rank 0 makes that so: at each loop turn it broadcasts a :class:`TpStep`
(the requests, aborts and flushes it received, the grammar requests that are ready, a stop flag) as msgspec
msgpack bytes over the gloo CPU group (never pickle); every rank then applies the messages and runs one
``step()``. Sampled token ids are broadcast from rank 0 (``TPGroup.share_tokens``, called by the
OutputProcessor), so even a sampler that is not bit-exact across ranks cannot split them. Info and flush
requests travel too: every rank's cache stats are gathered for rank 0's reply (``TPGroup.gather_json``), in
the order ``control.py`` fixes for each message, since every rank applies them with ``Scheduler.handle``.

Processes: ``radixrt serve --tp N`` on one machine makes the scheduler process rank 0, which spawns ranks
1..N-1 itself (``spawn_workers``, TCP rendezvous on 127.0.0.1). Under ``torchrun`` (``RANK``/``WORLD_SIZE``
set) rank 0 runs the whole server and the other ranks run only :func:`run_worker` (``radixrt serve`` sees
``RANK > 0``), joined by ``env://``. A rank that dies ends rank 0's loop with an error naming it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import uuid
import socket
import subprocess
import sys
import time
from typing import Optional

import msgspec
import torch
import torch.distributed as dist

from radixrt.runtime.io_struct import OpenSessionReq
from radixrt.runtime.scheduler.control import Message
from radixrt.runtime.layers.parallel import TPGroup, init_tp

logger = logging.getLogger("radixrt.tp")
ARGS_ENV = "RADIXRT_TP_ARGS"  # the ServerArgs (msgspec JSON) handed to a spawned rank


class TpStep(msgspec.Struct):
    """What every rank applies before one loop turn, in order."""

    msgs: list[Message] = []
    grammar_ready: list[str] = []  # rids whose grammar rank 0 promotes this turn
    now: float = 0.0  # rank 0's clock for this turn (session timestamps and TTLs)
    stop: bool = False


def name_sessions(msgs: list) -> None:
    """Rank 0: give every unnamed OpenSessionReq its id now, so that all ranks open the same session."""
    for m in msgs:
        if isinstance(m, OpenSessionReq) and m.session_id is None:
            m.session_id = uuid.uuid4().hex


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(TpStep)


def share_step(tp: TPGroup, step: Optional[TpStep]) -> TpStep:
    """Rank 0 passes its ``step`` and every rank gets it back (length, then bytes, over the gloo group)."""
    if tp.rank == 0:
        data = _enc.encode(step)
        n = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(n, 0, group=tp.cpu_group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, group=tp.cpu_group)
        return step
    n = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(n, 0, group=tp.cpu_group)
    buf = torch.empty(int(n), dtype=torch.uint8)
    dist.broadcast(buf, 0, group=tp.cpu_group)
    return _dec.decode(buf.numpy().tobytes())


def apply_step(sched, step: TpStep) -> None:
    """Apply rank 0's messages on a worker rank, through the same :meth:`Scheduler.handle` as rank 0 (so the
    same collectives in the same order: see ``control.py``); rank 0 alone sends the replies."""
    for msg in step.msgs:
        sched.handle(msg)
    sched.gate_grammar(step.grammar_ready)


def grammar_ready(sched) -> list[str]:
    """Rank 0: the grammar requests whose compile finished, promoted this turn on every rank."""
    return [r.rid for r in sched.grammar_queue if r.grammar_future.done()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_workers(args_json: bytes, size: int) -> tuple[str, list[subprocess.Popen]]:
    """Start ranks 1..size-1 on this machine as ``python -m radixrt.runtime.scheduler.tp_lockstep`` (the scheduler
    process is a daemon, which multiprocessing forbids to have children). They share this process group, and die with
    this process (PR_SET_PDEATHSIG on Linux; a closed gloo socket stops them anyway).
    Returns the rendezvous address and the processes."""
    init = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, ARGS_ENV: args_json.decode()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "radixrt.runtime.scheduler.tp_lockstep", str(r), str(size), init],
            env=env,
            preexec_fn=_die_with_parent,
        )
        for r in range(1, size)
    ]
    return init, procs


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def check_workers(procs: list[subprocess.Popen]) -> None:
    """Raises RuntimeError naming the first rank that exited."""
    for r, p in enumerate(procs, start=1):
        if p.poll() is not None:
            raise RuntimeError(f"tensor-parallel rank {r} (pid {p.pid}) exited with code {p.returncode}")


def peer_failure(procs: list[subprocess.Popen], err: Exception, wait_s: float = 5.0) -> RuntimeError:
    """The error to stop rank 0 with after a collective failed: names the rank that died when one did
    (its exit may take a moment to be seen), else says which collective error it was."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            check_workers(procs)
        except RuntimeError as dead:
            return dead
        if time.monotonic() > deadline:
            return RuntimeError(f"a tensor-parallel peer failed: {type(err).__name__}: {err}")
        time.sleep(0.1)


def run_worker(args_json: bytes, rank: int, size: int, init_method: Optional[str]) -> None:
    """A rank > 0: build the sharded scheduler, then apply rank 0's steps until told to stop."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from radixrt.runtime.config import ServerArgs

    args = msgspec.json.decode(args_json, type=ServerArgs)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; rank 0 stops us
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"[%(asctime)s tp{rank}] %(levelname)s %(name)s: %(message)s",
    )
    from radixrt.runtime.scheduler.build import build_scheduler
    from radixrt.runtime.layers.parallel import rank_device
    from radixrt.runtime.executor.model_runner import resolve_device_dtype

    tp = init_tp(rank, size, rank_device(resolve_device_dtype(args.device, args.dtype)[0], rank), init_method)
    sched = build_scheduler(args, tp)
    clock = sched.sessions.clock  # a TurnClock: set to rank 0's time at every turn
    try:
        while True:
            step = share_step(tp, None)
            if step.stop:
                return
            clock.set(step.now)
            apply_step(sched, step)
            sched.run_once()
    except Exception as e:  # a dead peer: say so and leave (the server reports rank 0's exit)
        logger.error("tp rank %d stops: %s: %s", rank, type(e).__name__, e)
        sys.exit(1)
    finally:
        if sched.grammar_cache is not None:
            sched.grammar_cache.shutdown(wait=False)


if __name__ == "__main__":  # a rank spawned by spawn_workers: RANK SIZE INIT_METHOD, args in the environment
    run_worker(os.environ.pop(ARGS_ENV).encode(), int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
