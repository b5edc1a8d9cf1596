"""The faults of the soak suite (benchmarks/soak.py), each injected while a round's load runs, each
followed by a normal request that must succeed: its time from the fault is the recovery time.

- ``scheduler`` / ``detokenizer`` / ``tp_rank``: kill -9 of that process (pids from ``/get_server_info``;
  a ``--tp`` rank is a child of the scheduler process);
- ``big_body``: 10 MB bodies (``Content-Length`` and chunked): each must be a 413 at once;
- ``slowloris``: sockets sending request headers a byte at a time for the whole round;
- ``aborts``: 1,000 ``/abort_request`` calls for unknown ids, each ``{"success": true}``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import httpx

KILLS = ("scheduler", "detokenizer", "tp_rank")
FAULTS = KILLS + ("big_body", "slowloris", "aborts")
PROBE = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


def scheduler_children(pid: int) -> list[int]:
    """Child pids of ``pid`` (Linux /proc), without multiprocessing's resource tracker."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(x) for x in f.read().split()]
    keep = []
    for p in out:
        try:
            with open(f"/proc/{p}/cmdline") as f:
                if "resource_tracker" not in f.read():
                    keep.append(p)
        except OSError:
            pass
    return keep


async def recover(http: httpx.AsyncClient, t_fault: float, timeout: float = 300.0) -> float:
    """Seconds from ``t_fault`` (perf_counter) to the first successful normal request."""
    while True:
        try:
            r = await http.post("/generate", json=PROBE)
            if r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4:
                return time.perf_counter() - t_fault
        except httpx.TransportError:
            pass
        if time.perf_counter() - t_fault > timeout:
            raise RuntimeError(f"no successful request within {timeout:.0f} s of the fault")
        await asyncio.sleep(0.1)


async def inject(url: str, headers: dict, fault: str, delay: float, duration: float) -> dict:
    """Wait ``delay`` s (the round's streams are running), inject ``fault``, then measure recovery."""
    await asyncio.sleep(delay)
    out: dict = {"fault": fault}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        if fault in KILLS:
            pids = (await http.get("/get_server_info")).json()["process_ids"]
            if fault == "tp_rank":
                ranks = scheduler_children(pids["scheduler"])
                if not ranks:
                    raise RuntimeError("tp_rank fault: the server runs no --tp rank (start it with --tp 2)")
                pid = ranks[0]
            else:
                pid = pids[fault]
            t = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            out["pid"] = pid
            out["recovery_s"] = await recover(http, t)
            h = (await http.get("/get_server_info")).json()
            out["restarts"] = h.get("restarts")
        elif fault == "big_body":
            big = b'{"text": "' + b"a" * (10 << 20) + b'"}'
            t = time.perf_counter()
            r1 = await http.post("/generate", content=big, headers={"Content-Type": "application/json"})

            async def chunks():
                for i in range(0, len(big), 1 << 20):
                    yield big[i : i + (1 << 20)]

            r2 = await http.post("/v1/chat/completions", content=chunks())
            out["statuses"] = [r1.status_code, r2.status_code]
            out["ok"] = out["statuses"] == [413, 413]
            out["recovery_s"] = await recover(http, t)
        elif fault == "slowloris":
            t = time.perf_counter()
            socks = await asyncio.to_thread(_open_slow, url, 32)
            out["recovery_s"] = await recover(http, t)
            end = time.perf_counter() + duration
            while time.perf_counter() < end:  # a header byte every half second, for the round
                await asyncio.to_thread(_drip, socks)
                await asyncio.sleep(0.5)
            for s in socks:
                s.close()
            out["sockets"] = len(socks)
        elif fault == "aborts":
            t = time.perf_counter()
            sem = asyncio.Semaphore(32)

            async def one(i):
                async with sem:
                    return (await http.post("/abort_request", json={"rid": f"unknown-{i}"})).json()

            got = await asyncio.gather(*(one(i) for i in range(1000)))
            out["ok"] = all(g == {"success": True} for g in got)
            out["recovery_s"] = await recover(http, t)
        else:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    return out


def _open_slow(url: str, n: int) -> list[socket.socket]:
    host, port = url.split("//")[1].split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: " + host.encode() + b"\r\n")
        socks.append(s)
    return socks


def _drip(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.sendall(b"X")
        except OSError:
            pass
