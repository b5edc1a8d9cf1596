"""``radixrt serve`` against ``llama-server`` on one GGUF: time to first token from a cold start, peak RSS.

Per file, one after the other in the same run: the page cache dropped (``sync; echo 3 >
/proc/sys/vm/drop_caches``, root only: recorded as ``cold: false`` where it cannot be written), the server
started, ``/health`` polled every 50 ms, then one request of 16 prompt ids for 1 greedy token; load time is
spawn to that token. Then ``--requests`` more requests (64-token prompt, 16 tokens out) so that the peak
includes a decode, and the peak RSS: the sum of ``VmHWM`` over the server's process tree (``/proc``), and for
radixrt its own ``/get_server_info`` ``memory`` report beside it. Both run with 2 threads; radixrt with
``--quantization auto`` and ``--max-total-tokens`` (the KV pool), llama-server with ``-c`` of the same size
and 1 slot (its KV buffer is f16 at ``-c`` tokens).

    cpuslot --all python benchmarks/real_serve.py FILE.gguf [FILE.gguf ...] [--kv-tokens 4096]

Appends one JSON line per file and system to ``benchmarks/results/real_serve.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from peers import llama_binary  # noqa: E402

OUT = os.path.join(HERE, "results", "real_serve.jsonl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def post(url: str, body: dict, timeout: float = 1200) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def tree_hwm(pid: int) -> dict:
    """VmHWM (peak RSS, bytes) of ``pid`` and every descendant still alive, by pid."""
    out = {}
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    out[f"{p.pid}:{p.name()}"] = int(line.split()[1]) * 1024
        except (OSError, psutil.NoSuchProcess):
            pass
    return out


def run_one(system: str, path: str, a) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if system == "radixrt":
        cmd = [
            sys.executable,
            "-m",
            "radixrt",
            "serve",
            "--model",
            path,
            "--port",
            str(port),
            "--zmq-port",
            str(free_port()),
            "--quantization",
            "auto",
            "--num-threads",
            "2",
            "--max-total-tokens",
            str(a.kv_tokens),
            "--context-length",
            str(min(a.kv_tokens, 8192)),
            "--log-level",
            "warning",
            "--speculative-algorithm",
            "none",
            *a.radixrt_args.split(),
        ]
    else:
        cmd = [
            llama_binary("llama-server"),
            "-m",
            path,
            "-t",
            "2",
            "-tb",
            "2",
            "-c",
            str(a.kv_tokens),
            "-np",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-webui",
            "--log-disable",
        ]
    cold = drop_caches() if a.cold else False
    rec = {
        "system": system,
        "file": os.path.basename(path),
        "file_bytes": os.path.getsize(path),
        "cold": cold,
        "kv_tokens": a.kv_tokens,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    t0 = time.perf_counter()
    srv = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(f"/tmp/real_serve_{system}.log", "w"),
        env=dict(os.environ, PYTHONPATH=ROOT),
        start_new_session=True,
    )
    try:
        while True:
            if srv.poll() is not None:
                raise RuntimeError(f"{system} exited {srv.returncode}: see /tmp/real_serve_{system}.log")
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except Exception:
                pass
            if time.perf_counter() - t0 > 1800:
                raise RuntimeError(f"{system} not ready in 1800 s")
            time.sleep(0.05)
        rec["health_s"] = time.perf_counter() - t0
        ids = [1 + (i * 7919) % 40000 for i in range(16)]
        if system == "radixrt":
            gen = lambda p, n: post(
                url + "/generate",
                {
                    "input_ids": p,
                    "sampling_params": {  # noqa: E731
                        "max_new_tokens": n,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                },
            )
        else:
            gen = lambda p, n: post(
                url + "/completion",
                {
                    "prompt": p,
                    "n_predict": n,  # noqa: E731
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )
        gen(ids, 1)
        rec["load_to_first_token_s"] = time.perf_counter() - t0
        t = time.perf_counter()
        for r in range(a.requests):
            gen([1 + (i * 104729 + r * 31) % 40000 for i in range(64)], 16)
        rec["requests_s"] = time.perf_counter() - t
        hwm = tree_hwm(srv.pid)
        rec["peak_rss_by_process"] = hwm
        rec["peak_rss_total_bytes"] = sum(hwm.values())
        if system == "radixrt":
            info = json.loads(urllib.request.urlopen(url + "/get_server_info").read())
            rec["server_info_memory"] = info.get("memory")
    finally:
        try:
            os.killpg(srv.pid, 15)
        except ProcessLookupError:
            pass
        try:
            srv.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, 9)
            srv.wait()
    rec["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--systems", default="radixrt,llama.cpp")
    ap.add_argument("--kv-tokens", type=int, default=4096)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--radixrt-args", default="")
    ap.add_argument("--no-cold", dest="cold", action="store_false")
    a = ap.parse_args()
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    for path in a.files:
        for system in a.systems.split(","):
            try:
                rec = run_one(system, path, a)
            except Exception as e:  # noqa: BLE001 - recorded, the next system still runs
                rec = {"system": system, "file": os.path.basename(path), "error": str(e)}
            rec["commit"] = commit
            with open(OUT, "a") as f:
                f.write(json.dumps(rec) + "\n")
            mb = rec.get("peak_rss_total_bytes", 0) / 2**20
            print(
                f"{rec['file']} {system}: "
                + (
                    rec["error"]
                    if "error" in rec
                    else f"first token {rec['load_to_first_token_s']:.1f} s (health {rec['health_s']:.1f} s, cold "
                    f"{rec['cold']}), peak RSS {mb:.0f} MiB over {len(rec['peak_rss_by_process'])} processes, "
                    f"load {rec['load_before'][0]}"
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
