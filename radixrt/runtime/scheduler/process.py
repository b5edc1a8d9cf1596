"""The scheduler process of ``radixrt serve``: model, KV pool, radix tree.

    main (TokenizerManager) --PUSH/PULL GenerateReq|AbortReq|FlushCacheReq|GetInfoReq|Open/CloseSessionReq--> scheduler
    scheduler --PUSH/PULL BatchTokenOut|InfoOut|ReadyOut--> detokenizer (InfoOut/ReadyOut pass through)

Every message is a msgspec msgpack Struct (tagged union); nothing is pickled. Info and flush replies go
through the same pipe as the token outputs, so they reach the main process in order with them (a reply
to a GetInfoReq sent after a request finished comes after that request's last output).

The process exits when its parent dies (it polls ``os.getppid()``), so no orphan survives a killed server.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
import msgspec
import zmq

from radixrt.runtime.child import IDLE_POLL_MS, parent_alive, setup_child
from radixrt.runtime.io_struct import BatchTokenOut, ReadyOut, TokenOut
from radixrt.runtime.scheduler.control import Message

logger = logging.getLogger("radixrt.scheduler_process")

GRAMMAR_POLL_MS = 2  # only requests waiting for a grammar compile: poll often, but do not spin


def run_scheduler_process(
    args_json: bytes, in_addr: str, out_addr: str, parent_pid: int, exit_note: str | None = None
) -> None:
    """Entry point (multiprocessing "spawn" target). ``args_json``: msgspec-JSON of ServerArgs; ``exit_note``:
    a file where the reason is written when a ``--tp`` rank's death stops this process (the supervisor
    reads it, since this process's exit code alone cannot name the rank)."""
    # OpenMP workers that spin between parallel regions fight the main and detokenizer processes (and
    # anything else on the host) for cores, slowing every decode step (docs/measurements.md).
    # Sleeping workers cost a wake-up per parallel op, so radixrt's C++ kernels, ~150 calls per decode step,
    # run on radixrt's own pool instead (kernels/parallel.h: a bounded spin). An explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from radixrt.runtime.config import ServerArgs

    args = msgspec.json.decode(args_json, type=ServerArgs)
    setup_child(args.log_level, "scheduler")
    zmq_ctx = zmq.Context(1)
    pull = zmq_ctx.socket(zmq.PULL)
    pull.connect(in_addr)
    push = zmq_ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    enc = msgspec.msgpack.Encoder()
    tp, workers = None, []
    try:
        from radixrt.runtime.scheduler.build import build_scheduler

        if args.tp > 1:
            tp, workers = _start_tp(args, args_json)
        sched = build_scheduler(args, tp, defer_grammar=True)  # ready waits for no grammar backend
    except BaseException as e:  # tell the main process why, then exit
        logger.error("model load failed:\n%s", traceback.format_exc())
        push.send(enc.encode(ReadyOut(error=f"{type(e).__name__}: {e}")))
        push.close(linger=2000)
        zmq_ctx.term()
        sys.exit(1)
    runner = sched.runner
    if sched.req_pages.hicache is not None:  # the stop's SIGTERM unwinds to the finally below: files get written
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    push.send(
        enc.encode(
            ReadyOut(
                model_name=runner.source.name,
                context_length=runner.context_length,
                vocab_size=runner.vocab_size,
                max_total_tokens=runner.num_pages * runner.page_size,
                page_size=runner.page_size,
            )
        )
    )
    try:
        _loop(sched, pull, push, enc, parent_pid, tp, workers)
    except RuntimeError as e:
        if tp is None:
            raise
        from radixrt.runtime.scheduler.tp_lockstep import peer_failure

        err = peer_failure(workers, e)
        logger.error("scheduler loop died: %s", err)
        if exit_note is not None:
            with open(exit_note, "w") as f:
                f.write(str(err))
        raise err from e
    except SystemExit:  # SIGTERM with tiers on (below): a stop, not a death
        raise
    except BaseException:
        logger.error("scheduler loop died:\n%s", traceback.format_exc())
        raise
    finally:
        if sched.grammar_cache is not None:
            sched.grammar_cache.shutdown(wait=False)
        if sched.req_pages.hicache is not None:  # queued tier-3 writes reach their files
            sched.req_pages.hicache.close()
        # nobody is left to read what is queued (the parent is gone or stopping us): ZMQ's default linger
        # would hold the context's term() forever on an unsent message, and the process with it
        push.close(linger=0)
        pull.close(linger=0)
        zmq_ctx.term()


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def _check_split(args) -> None:
    """Refuse a ``--tp`` that the model's heads or MLP width do not split, before any rank is spawned (each
    would load the model only to fail the same way).

    Raises:
        ValueError: naming the count that does not split.
    """
    from radixrt.runtime.layers.parallel import inter_share
    from radixrt.runtime.layers.tp_shard import local_heads
    from radixrt.runtime.models.args import ModelArgs
    from radixrt.runtime.models.loader import load_config

    a = ModelArgs.from_hf(load_config(args.model))
    local_heads(a.num_heads, a.num_kv_heads, args.tp)
    inter_share(a.intermediate_size, args.tp)


def _start_tp(args, args_json: bytes):
    """Rank 0 of ``--tp``: under torchrun the other ranks exist already (``env://``); else spawn them here."""
    from radixrt.runtime.layers.parallel import init_tp, rank_device
    from radixrt.runtime.executor.model_runner import resolve_device_dtype
    from radixrt.runtime.scheduler.tp_lockstep import spawn_workers

    _check_split(args)
    device = rank_device(resolve_device_dtype(args.device, args.dtype)[0], 0)
    if "WORLD_SIZE" in os.environ:
        if int(os.environ["WORLD_SIZE"]) != args.tp:
            raise ValueError(f"tp ({args.tp}) must equal torchrun's WORLD_SIZE ({os.environ['WORLD_SIZE']})")
        return init_tp(0, args.tp, device), []
    init, workers = spawn_workers(args_json, args.tp)
    return init_tp(0, args.tp, device, init), workers


def _loop(sched, pull, push, enc, parent_pid: int, tp=None, workers=()) -> None:
    from radixrt.runtime.scheduler.tp_lockstep import (
        TpStep,
        check_workers,
        grammar_ready,
        name_sessions,
        share_step,
    )

    clock = sched.sessions.clock if tp is not None else None  # a TurnClock: rank 0's time, shared each turn
    dec = msgspec.msgpack.Decoder(Message)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    deferred = True  # build_scheduler's deferred loads: started once idle (or by a request that needs them)
    while True:
        if not parent_alive(parent_pid):
            logger.info("the parent process is gone; exiting")
            if tp is not None:
                share_step(tp, TpStep(stop=True))
            return
        if sched.running or sched.waiting or sched.finished_outs:
            timeout = 0
        elif sched.grammar_queue:
            timeout = GRAMMAR_POLL_MS
        else:
            timeout = IDLE_POLL_MS
        msgs = []
        if poller.poll(timeout):
            while True:
                try:
                    msgs.append(dec.decode(pull.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
        elif deferred and timeout == IDLE_POLL_MS:  # a poll period with nothing to do: not during the first
            # requests, whose steps would share the cores and the GIL with the transformers import
            from radixrt.runtime.scheduler.build import start_deferred

            start_deferred(sched)
            deferred = False
        if tp is not None:  # lockstep: every rank applies these messages, then runs the same step
            check_workers(workers)
            name_sessions(msgs)
            ready, now = grammar_ready(sched), time.monotonic()
            clock.set(now)
            share_step(tp, TpStep(msgs, ready, now))
            sched.gate_grammar(ready)
        for msg in msgs:
            reply = sched.handle(msg)
            if isinstance(reply, TokenOut):
                push.send(enc.encode(BatchTokenOut([reply])))
            elif reply is not None:
                push.send(enc.encode(reply))
        outs = sched.run_once()  # under --tp, session TTLs run on rank 0's clock
        if outs:
            push.send(enc.encode(BatchTokenOut(outs)))
