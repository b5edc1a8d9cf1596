"""``make demo``: start ``radixrt serve`` with the default model, run the tool agent against it, stop it.

Steps: pick free ports, start the server in its own process group (its log goes to a temporary file,
printed if anything fails), wait for ``GET /health`` to return 200, run ``examples/tool_agent.py
--backend tcp://127.0.0.1:<zmq port>`` (its report is the demo's output), then SIGTERM the server and wait
for it to exit (SIGKILL after 30 s). The server gets ``cores - 1`` torch threads (at least 1) so that the
client and the server's other processes keep a core: oversubscribed OpenMP threads slow every step down
many times over. Exit status: the agent's (1 if the server never became healthy).

    python examples/run_demo.py [--num-threads N] [agent arguments, e.g. --num-questions 16]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> None:
    """Raises RuntimeError when the server exits or is not healthy within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"radixrt serve exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"radixrt serve was not healthy after {timeout:.0f} s")


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM the server's process group; SIGKILL it after ``timeout`` seconds. Returns the exit status."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--num-threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="torch threads of the server (default: cores - 1)",
    )
    p.add_argument("--health-timeout", type=float, default=300.0, help="seconds to wait for the model to load")
    a, agent_args = p.parse_known_args(argv)
    port, zmq_port = free_port(), free_port()
    while zmq_port == port:
        zmq_port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="radixrt-demo-", suffix=".log", delete=False)
    cmd = [
        sys.executable,
        "-m",
        "radixrt",
        "serve",
        "--port",
        str(port),
        "--zmq-port",
        str(zmq_port),
        "--num-threads",
        str(a.num_threads),
        "--log-level",
        "warning",
    ]
    # the first run builds the C++ kernels (2-3 min on 2 cores, longer on a busy box): here, before the server,
    # so that --health-timeout only covers loading the model
    from radixrt.kernels import cpp

    t0 = time.monotonic()
    if not os.path.exists(os.path.join(cpp.build_dir(), "built.ok")):
        print("building the C++ kernels (first run only) ...", flush=True)
    cpp.ops("radixrt_ggml")
    print(f"kernels ready in {time.monotonic() - t0:.1f} s", flush=True)
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rc = 1
    try:
        try:
            wait_healthy(proc, url, a.health_timeout)
        except RuntimeError as e:
            log.flush()
            print(f"{e}\n--- server log ({log.name}) ---\n{Path(log.name).read_text()[-4000:]}", file=sys.stderr)
            return 1
        print(
            f"server healthy after {time.monotonic() - t0:.1f} s at {url} (DSL socket tcp://127.0.0.1:{zmq_port})\n",
            flush=True,
        )
        agent = [
            sys.executable,
            str(ROOT / "examples" / "tool_agent.py"),
            "--backend",
            f"tcp://127.0.0.1:{zmq_port}",
            *agent_args,
        ]
        rc = subprocess.call(agent, cwd=ROOT)
    finally:
        status = stop(proc)
        print(f"\nserver stopped (exit status {status}); demo took {time.monotonic() - t0:.1f} s", flush=True)
        if rc == 0:
            os.unlink(log.name)
    return rc


if __name__ == "__main__":
    sys.exit(main())
