"""The scheduler's message handler: one place that applies every message of the wire (``io_struct``) to a
:class:`~radixrt.runtime.scheduler.scheduler.Scheduler`, for every driver loop: the scheduler process
(``process.py``), each ``--tp`` worker rank (``tp_lockstep.py``) and the in-process ``Engine``.

Under ``--tp``, rank 0 broadcasts each turn's messages (``tp_lockstep.share_step``) and every rank calls
:func:`handle` on them in the same order. The ranks then stay in step only if each message makes the same
collectives on every rank, in the same order, so that order is fixed here, per message, and nowhere else:

    GenerateReq      none: a refused request fails the same way on every rank; rank 0's reply says why
    AbortReq         none
    FlushCacheReq    flush this rank's tree, then one ``gather_json`` of the ranks' cache stats
    GetInfoReq       one ``gather_json`` of the ranks' cache stats
    OpenSessionReq   one ``gather_json`` (the reply shows the tree before the session), then open it
    CloseSessionReq  close it, then one ``gather_json``

Every rank builds the reply; only rank 0 sends it (the workers drop theirs).
"""

from __future__ import annotations

import logging
from typing import Union

from radixrt.runtime.io_struct import (
    AbortReq,
    FinishAbort,
    CloseSessionReq,
    FlushCacheReq,
    GenerateReq,
    GetInfoReq,
    InfoOut,
    OpenSessionReq,
    TokenOut,
)

logger = logging.getLogger(__name__)

Message = Union[GenerateReq, AbortReq, FlushCacheReq, GetInfoReq, OpenSessionReq, CloseSessionReq]
MESSAGES = (GenerateReq, AbortReq, FlushCacheReq, GetInfoReq, OpenSessionReq, CloseSessionReq)


def handle(sched, msg: Message, tp=None) -> Union[InfoOut, TokenOut, None]:
    """Apply ``msg`` to ``sched`` (``tp``: this rank's TPGroup under ``--tp``, else None).

    Returns the reply to send: an :class:`InfoOut` for flush, info and session messages; a finished
    :class:`TokenOut` (finish reason ``abort`` with the error) for a request ``add_request`` refused; None
    for an accepted request or an abort.

    Raises:
        TypeError: ``msg`` is not a scheduler message (the wire's decoder admits none such).
    """
    if isinstance(msg, GenerateReq):
        try:
            sched.add_request(msg)
        except Exception as e:  # validated in the main process; never let one request kill the loop
            logger.exception("add_request failed for %s", msg.rid)
            return TokenOut(
                rid=msg.rid,
                new_token_ids=[],
                prompt_tokens=len(msg.input_ids),
                finished_reason=FinishAbort(f"{type(e).__name__}: {e}"),
            )
        return None
    if isinstance(msg, AbortReq):
        sched.abort(msg.rid)
        return None
    if isinstance(msg, FlushCacheReq):
        flushed = sched.flush_cache()
        return info(sched, flushed, tp)
    if isinstance(msg, GetInfoReq):
        return info(sched, None, tp, top=msg.top)
    if isinstance(msg, OpenSessionReq):
        reply = info(sched, None, tp)
        reply.session_id = sched.sessions.open_req(msg)
        return reply
    if isinstance(msg, CloseSessionReq):
        closed = sched.sessions.close(msg.session_id)
        return info(sched, closed, tp)
    raise TypeError(f"not a scheduler message: {type(msg).__name__}")


def info(sched, flushed=None, tp=None, top: int = 0) -> InfoOut:
    """The scheduler's queue and cache stats as an :class:`InfoOut`; under ``--tp`` with every rank's cache
    stats (one ``gather_json``, made by every rank) in ``cache["tp_ranks"]``, to check that the trees agree.
    ``top`` > 0 adds a summary of the tree's ``top`` largest subtrees."""
    from radixrt.runtime.mem.tree_summary import summarize_tree
    from radixrt.runtime.scheduler.server_info import queue_stats

    stats = queue_stats(sched)
    if tp is not None:
        stats["cache"]["tp_ranks"] = tp.gather_json(sched.cache_stats())
    tree = summarize_tree(sched.tree, top) if top > 0 and sched.tree is not None else None
    return InfoOut(**stats, flushed=flushed, tree=tree)
