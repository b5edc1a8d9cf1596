"""``GET /get_server_info``'s dict in the server: the scheduler's reply (:class:`InfoOut`) plus what only the
main process knows (the version, every process's pid and peak RSS, restarts, requests in flight), in the
Engine's shape (``scheduler/server_info.py``)."""

from __future__ import annotations

import os

from radixrt.runtime.executor.memory import peaks_agreeing
from radixrt.runtime.io_struct import InfoOut
from radixrt.runtime.scheduler.server_info import server_info


def main_server_info(tm, info: InfoOut) -> dict:
    """``tm``: the TokenizerManager (ready); ``info``: the scheduler's answer to a ``GetInfoReq``."""
    r = tm.ready_info
    pids = {"main": os.getpid(), **tm.children.pids()}
    memory = dict(info.memory or {})
    memory["peak_rss_by_process"] = peaks_agreeing(memory, pids)
    stats = {"cache": info.cache, "num_running": info.num_running, "num_waiting": info.num_waiting, "memory": memory}
    return server_info(
        tm.args,
        stats,
        r.context_length,
        r.max_total_tokens,
        tm.model_name,
        version=_version(),
        process_ids=pids,
        restarts=dict(tm.supervisor.restarts),
        num_in_flight=len(tm.states),
    )


def _version() -> str:
    import radixrt

    return radixrt.__version__
