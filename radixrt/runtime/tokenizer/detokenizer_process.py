"""The detokenizer process of ``radixrt serve``.

PULL ``BatchTokenOut`` from the scheduler -> :meth:`Detokenizer.handle` -> PUSH ``BatchStrOut`` to the main
process. ``InfoOut`` and ``ReadyOut`` pass through unchanged, in order. msgspec msgpack only.
Exits when its parent dies.
"""

from __future__ import annotations

import logging

import msgspec
import zmq

from radixrt.runtime.io_struct import BatchTokenOut, SchedulerProcessOutput
from radixrt.runtime.child import IDLE_POLL_MS, parent_alive, setup_child

logger = logging.getLogger("radixrt.detokenizer_process")


def run_detokenizer_process(model: str | None, log_level: str, in_addr: str, out_addr: str, parent_pid: int) -> None:
    """Entry point (multiprocessing "spawn" target)."""
    setup_child(log_level, "detokenizer")
    from radixrt.runtime.tokenizer.detokenizer import Detokenizer
    from radixrt.runtime.models.loader import load_backend_tokenizer  # tokenizers only: no torch here

    zmq_ctx = zmq.Context(1)
    pull = zmq_ctx.socket(zmq.PULL)
    pull.bind(in_addr)
    push = zmq_ctx.socket(zmq.PUSH)
    push.connect(out_addr)
    detok = Detokenizer(load_backend_tokenizer(model))
    dec = msgspec.msgpack.Decoder(SchedulerProcessOutput)
    enc = msgspec.msgpack.Encoder()
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    try:
        while parent_alive(parent_pid):
            if not poller.poll(IDLE_POLL_MS):
                continue
            while True:
                try:
                    frame = pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg = dec.decode(frame)
                if isinstance(msg, BatchTokenOut):
                    push.send(enc.encode(detok.handle(msg)))
                else:
                    push.send(frame)
    except BaseException:
        logger.exception("detokenizer died")
        raise
    finally:  # the parent is gone: drop what is queued (a default linger would hang term() forever)
        push.close(linger=0)
        pull.close(linger=0)
        zmq_ctx.term()
