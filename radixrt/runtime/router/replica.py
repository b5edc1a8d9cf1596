"""One data-parallel replica: a whole ``radixrt serve`` process, wrapped as a Ray Serve deployment.

The replica starts ``python -m radixrt serve`` on 127.0.0.1 and a free port of its node, with the flags the
user gave ``radixrt serve --dp N`` (minus the cluster ones), waits for its ``/health``, and forwards the
ingress's requests to it over HTTP. Each replica therefore has its own scheduler, KV pool and radix tree,
exactly as a single-node server; the router's job is to send each prompt where its prefix is cached.

The server is started with ``PR_SET_PDEATHSIG`` (Linux), so a replica actor that is killed (SIGKILL, node
loss) takes its server down with it; the server's own children already exit with their parent. A replica
that Ray Serve retires (scale-down, redeploy, shutdown: it calls ``__del__``) drains its server as
``radixrt serve`` does on SIGTERM (:func:`drain_server`): running requests finish for up to
``--drain-timeout`` seconds, new ones get 503 meanwhile (the router sends them elsewhere).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

READY_TIMEOUT_S = 600
DRAIN_MARGIN_S = 10.0  # beyond --drain-timeout: the server's own shutdown (children joined, sockets closed)


def drain_server(proc: subprocess.Popen, drain_timeout: float) -> int:
    """SIGTERM a ``radixrt serve`` process and wait for its drain (``drain_timeout`` seconds, the server's
    ``--drain-timeout``, plus :data:`DRAIN_MARGIN_S`); SIGKILL it if it is still there. Returns its exit
    status (0 after a clean drain)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=drain_timeout + DRAIN_MARGIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the replica's __del__ still stops the server on a clean shutdown
        pass


class RadixrtReplica:
    """Ray Serve deployment class (wrapped with ``serve.deployment`` in router/app.py).

    Args:
        server_argv: ``radixrt serve`` flags for the replica's server (no --host/--port/--api-key).
        drain_timeout: the server's ``--drain-timeout`` (seconds), how long its retirement may take.

    Raises:
        RuntimeError: the server exited or did not become ready within ``READY_TIMEOUT_S`` seconds
            (its stderr tail is in the message).
    """

    proc: subprocess.Popen | None = None  # until the server is started (__del__ may follow a failed __init__)
    drain_timeout = 30.0

    def __init__(self, server_argv: list[str], drain_timeout: float = 30.0):
        from ray import serve

        self.drain_timeout = drain_timeout
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        port, zmq_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{port}"
        # an unnamed file (already unlinked): nothing is left behind however the replica ends
        self.log = tempfile.TemporaryFile(prefix=f"radixrt-replica-{self.replica_id}-")
        cmd = [sys.executable, "-m", "radixrt", "serve", "--port", str(port), "--zmq-port", str(zmq_port), *server_argv]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, preexec_fn=_die_with_parent)
        self._wait_ready()
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica server exited with {self.proc.returncode}: {self._tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"replica server not ready after {READY_TIMEOUT_S}s: {self._tail()}")

    def _tail(self) -> str:
        """The server's last 3000 bytes of stderr (pread: the child's write offset is left alone)."""
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, 3000, max(size - 3000, 0)).decode(errors="replace")

    async def __call__(self, req: dict) -> dict:
        """Forward ``req["path"]`` with JSON ``req["body"]``. Returns status, JSON body and this replica's id."""
        r = await self.client.request(req.get("method", "POST"), req["path"], json=req.get("body"))
        try:
            body = r.json()
        except ValueError:
            body = {"error": {"message": r.text[:1000], "type": "internal_error", "param": None, "code": None}}
        return {"status": r.status_code, "body": body, "replica": self.replica_id}

    async def stats(self) -> dict:
        """This replica's radix-cache counters (hit/query tokens, pages) and pids."""
        info = (await self.client.get("/get_server_info")).json()
        return {
            "replica": self.replica_id,
            "cache": info["cache"],
            "num_running": info["num_running"],
            "pid": os.getpid(),
            "server_pid": self.proc.pid,
        }

    async def flush(self) -> dict:
        """Empty this replica's radix cache (``POST /flush_cache``)."""
        return (await self.client.post("/flush_cache")).json()

    async def stream(self, req: dict):
        """Forward a streamed request; yields the server's SSE bytes as they come."""
        async with self.client.stream("POST", req["path"], json=req["body"]) as r:
            async for chunk in r.aiter_raw():
                yield chunk

    async def check_health(self) -> None:
        """Ray Serve health check. Raises RuntimeError when the server is gone or unhealthy."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"replica server exited with {self.proc.returncode}: {self._tail()}")
        r = await self.client.get("/health", timeout=10)
        if r.status_code != 200:
            raise RuntimeError(f"replica server /health answered {r.status_code}: {r.text[:300]}")

    def __del__(self) -> None:
        """Retired by Ray Serve: drain the server (the same path as SIGTERM to ``radixrt serve``)."""
        if self.proc is not None:
            drain_server(self.proc, self.drain_timeout)
