"""Soak-and-fault suite (issue 31): does ``radixrt serve`` keep serving through load, faults and restarts?

    python benchmarks/soak.py [--rounds 20] [--concurrency 64] [--faults scheduler,detokenizer,...]
                              [--tp 2] [--model M] [--out results/soak.json] [-- extra serve flags]

Starts its own server on 127.0.0.1 (loopback only), then:

1. ``--rounds`` rounds of ``--concurrency`` concurrent streaming clients (benchmarks/soak_load.py: chat,
   ``/generate``, JSON-schema constrained; shared and unique prefixes; 25 % hang up mid-stream, some
   abort). After each round, once idle: 0 running, 0 waiting, free + evictable + protected + private =
   total pages, protected = 0 and private = 0 (no sessions here), and the RSS of every server process:
   from round 1 to the last it must grow < 5 % (over 20 rounds or more), and from round 0 to 1 by no
   more than the KV pool's bytes (the pool is calloc'd: its pages count in RSS once first written).
2. One round per fault in ``--faults`` (benchmarks/soak_faults.py), the fault injected while it runs and
   followed by a normal request that must succeed (recovery time), then the same idle checks.

Bounded: every client has a timeout, every round a deadline; nothing waits forever. Exit status 1 when a
check fails (a lost request, accounting off, a fault without recovery), else 0. Reports (and ``--out``):
counts per round, p50/p99 TTFT, RSS per process per round and its growth after the first round, and each
fault's recovery time against the server's load time (start to ``/health`` 200).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_faults import FAULTS, inject, scheduler_children  # noqa: E402
from soak_load import run_round  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_DELAY_S = 1.5  # into the round: streams are running
FAULT_DURATION_S = 10.0  # how long slowloris keeps dripping its headers after the fault


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(extra: list[str], timeout: float = 600) -> tuple[subprocess.Popen, str, float, str]:
    """A ready server; returns (process, url, load seconds, log path)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="radixrt-soak-", suffix=".log", delete=False).name
    cmd = [
        sys.executable,
        "-m",
        "radixrt",
        "serve",
        "--port",
        str(port),
        "--zmq-port",
        str(free_port()),
        "--max-restarts",
        "100",
        "--log-level",
        "warning",
        *extra,
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {open(log).read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url, time.perf_counter() - t0, log
        except httpx.TransportError:
            pass
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"server not ready after {timeout:.0f} s")
        time.sleep(0.1)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def idle_check(url: str, timeout: float = 120) -> dict:
    """Wait until idle; returns the accounting, the problems found and the RSS (MB) of each process."""
    deadline = time.monotonic() + timeout
    while True:
        info = httpx.get(url + "/get_server_info", timeout=30).json()
        if info["num_running"] == 0 and info["num_waiting"] == 0:
            break
        if time.monotonic() > deadline:
            return {
                "problems": [
                    f"not idle after {timeout:.0f} s: {info['num_running']} running, {info['num_waiting']} waiting"
                ]
            }
        time.sleep(0.1)
    c = info["cache"]
    problems = []
    if c["free_pages"] + c["evictable_pages"] + c["protected_pages"] + c["private_pages"] != c["total_pages"]:
        problems.append(f"pages do not add up: {c}")
    if c["protected_pages"] or c["private_pages"]:
        problems.append(f"pages still held once idle: {c}")
    pids = dict(info["process_ids"])
    for i, p in enumerate(scheduler_children(pids["scheduler"]), start=1):
        pids[f"tp_rank{i}"] = p
    return {
        "problems": problems,
        "rss_mb": {k: round(rss_mb(p), 1) for k, p in pids.items()},
        "kv_pool_mb": round((info.get("memory") or {}).get("kv_pool_bytes", 0) / 2**20, 1),
        "pages": {
            k: c[k] for k in ("total_pages", "free_pages", "evictable_pages", "protected_pages", "private_pages")
        },
    }


def pct(xs: list[float], q: float):
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def _round(url: str, concurrency: int, seed: int, fault: str | None, duration: float = FAULT_DURATION_S) -> tuple:
    load = run_round(url, {}, concurrency, seed, fault=fault in ("scheduler", "detokenizer", "tp_rank"))
    if fault is None:
        return await load, None
    return tuple(await asyncio.gather(load, inject(url, {}, fault, FAULT_DELAY_S, duration)))


def summarize(i: int, res, idle: dict, fault: dict | None) -> dict:
    lost = [o for o in res.outcomes if o.status == "lost"]
    t = res.ttfts()
    row = {
        "round": i,
        "fault": fault,
        "completed": res.count("completed"),
        "hung_up": res.count("hung_up"),
        "aborted": res.count("aborted"),
        "refused": res.count("refused"),
        "lost": len(lost),
        "lost_detail": [f"{o.kind}: {o.detail}" for o in lost[:5]],
        "wall_s": round(res.wall_s, 2),
        "ttft_p50_s": pct(t, 0.5),
        "ttft_p99_s": pct(t, 0.99),
        **idle,
    }
    f = f" fault={fault['fault']} recovery={fault.get('recovery_s', float('nan')):.2f}s" if fault else ""
    print(
        f"round {i:2d}: {row['completed']} completed, {row['hung_up']} hung up, {row['aborted']} aborted, "
        f"{row['refused']} refused, {row['lost']} lost; TTFT p50 {row['ttft_p50_s'] or 0:.3f}s "
        f"p99 {row['ttft_p99_s'] or 0:.3f}s; wall {row['wall_s']}s; RSS {idle.get('rss_mb')}{f}"
        + (f"; PROBLEMS {idle['problems']}" if idle["problems"] else ""),
        flush=True,
    )
    return row


def run(
    rounds: int,
    concurrency: int,
    faults: list[str],
    serve_args: list[str],
    fault_duration_s: float = FAULT_DURATION_S,
) -> dict:
    """The whole suite against a fresh server; returns the report (``ok``: every check held).
    ``fault_duration_s``: how long the slowloris sockets keep dripping after they are opened."""
    proc, url, load_s, log = start(serve_args)
    print(
        f"server ready in {load_s:.1f} s (load time); {rounds} rounds of {concurrency} streams, faults {faults}",
        flush=True,
    )
    rows = []
    try:
        for i in range(rounds):
            res, _ = asyncio.run(_round(url, concurrency, i, None))
            rows.append(summarize(i, res, idle_check(url), None))
        for j, fault in enumerate(faults):
            res, f = asyncio.run(_round(url, concurrency, 1000 + j, fault, fault_duration_s))
            rows.append(summarize(rounds + j, res, idle_check(url), f))
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
    steady = [r for r in rows if r["fault"] is None and "rss_mb" in r]
    total = lambda r: sum(r["rss_mb"].values())
    growth = growth1 = None
    if len(steady) >= 2:
        growth = (total(steady[-1]) - total(steady[0])) / total(steady[0])
    if len(steady) >= 3:  # rounds 1..N: the KV pool is calloc'd, and round 0 only touches part of it
        growth1 = (total(steady[-1]) - total(steady[1])) / total(steady[1])
    recov = {r["fault"]["fault"]: r["fault"].get("recovery_s") for r in rows if r["fault"]}
    problems = [p for r in rows for p in r["problems"]] + [
        f"round {r['round']}: {r['lost']} lost" for r in rows if r["lost"]
    ]
    problems += [
        f"fault {r['fault']['fault']}: {r['fault']}" for r in rows if r["fault"] and r["fault"].get("ok") is False
    ]
    # A leak grows every round; the pool's first touch stops at its size. So: < 5 % from round 1 to the
    # last, and round 0 -> 1 by no more than the KV pool's bytes (pages touched for the first time).
    if growth1 is not None and rounds >= 20 and growth1 >= 0.05:
        problems.append(f"RSS grew {growth1:.1%} from round 1 to round {rounds - 1}")
    if growth1 is not None and total(steady[1]) - total(steady[0]) > steady[0]["kv_pool_mb"]:
        problems.append(
            f"RSS grew {total(steady[1]) - total(steady[0]):.0f} MB in round 1, more than the "
            f"KV pool ({steady[0]['kv_pool_mb']} MB)"
        )
    ttft = sorted(x for r in steady for x in ([r["ttft_p50_s"]] if r["ttft_p50_s"] else []))
    report = {
        "load_s": load_s,
        "rounds": rows,
        "rss_growth_after_round_0": growth,
        "rss_growth_after_round_1": growth1,
        "rss_growth_by_process_after_round_1": {
            k: round((steady[-1]["rss_mb"][k] - v) / v, 4)
            for k, v in steady[1]["rss_mb"].items()
            if k in steady[-1]["rss_mb"]
        }
        if growth1 is not None
        else None,
        "recovery_s": recov,
        "exit_status_after_sigterm": rc,
        "problems": problems,
        "ok": not problems and rc == 0,
        "ttft_p50_median_s": pct(ttft, 0.5),
        "ttft_p99_over_p50_worst": max(
            (r["ttft_p99_s"] / r["ttft_p50_s"] for r in steady if r["ttft_p50_s"]), default=None
        ),
        "server_log": log,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=1), flush=True)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--faults",
        default="scheduler,detokenizer,big_body,slowloris,aborts",
        help=f"comma-separated, of {FAULTS}; tp_rank needs --tp 2",
    )
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ns, extra = ap.parse_known_args()
    faults = [f for f in ns.faults.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        ap.error(f"--faults: unknown {bad}; choose from {FAULTS}")
    report = run(ns.rounds, ns.concurrency, faults, [a for a in extra if a != "--"])
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
