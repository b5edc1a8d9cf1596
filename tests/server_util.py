"""Helpers to run a real ``radixrt serve`` process in tests and talk to it (HTTP, SSE, the DSL socket)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 256


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999) and above Ray's worker ports (10002-19999): a
    port the kernel hands out for bind(0) could be taken by any process (Ray starts a dozen, each binding
    ports of its own) between this check and the server's bind (a --dp run failed so once)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


class ServerProc:
    """``python -m radixrt serve`` in its own process group; stdout/stderr go to files (read them on failure)."""

    def __init__(self, *extra: str, api_key: Optional[str] = None):
        self.port, self.zmq_port = free_port(), free_port()
        while self.zmq_port == self.port:
            self.zmq_port = free_port()
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.zmq_url = f"tcp://127.0.0.1:{self.zmq_port}"
        self.dir = tempfile.mkdtemp(prefix="radixrt-test-")
        self.out_path, self.err_path = os.path.join(self.dir, "stdout"), os.path.join(self.dir, "stderr")
        cmd = [
            sys.executable,
            "-m",
            "radixrt",
            "serve",
            "--port",
            str(self.port),
            "--zmq-port",
            str(self.zmq_port),
            "--max-total-tokens",
            "8192",
            "--context-length",
            str(CONTEXT),
            "--log-level",
            "warning",
            *extra,
        ]
        if "--quantization" not in extra:  # expected texts are HF fp32's (see conftest.make_engine)
            cmd += ["--quantization", "none"]
        if api_key:
            cmd += ["--api-key", api_key]
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"), start_new_session=True
        )
        self.pgid = self.proc.pid
        self.health_codes: list[int] = []

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 120), **kw)

    def logs(self) -> str:
        out, err = Path(self.out_path).read_text(), Path(self.err_path).read_text()[-6000:]
        return f"--- stdout ---\n{out}\n--- stderr ---\n{err}"

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}\n{self.logs()}")
            try:
                code = httpx.get(self.url + "/health", timeout=5).status_code
                self.health_codes.append(code)
                if code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s\n{self.logs()}")

    def stdout_lines(self) -> list[str]:
        return Path(self.out_path).read_text().splitlines()

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM the server; returns its exit status. Raises if anything of its process group survives."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pgid, signal.SIGKILL)
            raise RuntimeError(f"server did not stop on SIGTERM within {timeout}s\n{self.logs()}")
        deadline = time.time() + timeout
        while self.group_alive():
            if time.time() > deadline:
                os.killpg(self.pgid, signal.SIGKILL)
                raise RuntimeError("processes of the server's group survived its exit (orphans)")
            time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def kill(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait_idle(self, timeout: float = 60) -> dict:
        """Wait for no running/waiting request, then check the pool accounting; returns the cache stats."""
        deadline = time.time() + timeout
        with self.client() as c:
            while True:
                info = c.get("/get_server_info").json()
                if info["num_running"] == 0 and info["num_waiting"] == 0:
                    break
                if time.time() > deadline:
                    raise AssertionError(f"server not idle after {timeout}s: {info}")
                time.sleep(0.05)
        st = info["cache"]
        assert st["private_pages"] == 0, st
        assert st["free_pages"] + st["evictable_pages"] + st["protected_pages"] == st["total_pages"], st
        assert st["protected_pages"] == 0, f"a lock_ref stayed above 0: {st}"
        return st


def start_server(*extra: str, api_key: Optional[str] = None, timeout: float = 240) -> ServerProc:
    """A ready ``radixrt serve`` (extra CLI flags as given); killed, and the error re-raised, if it never
    gets ready within ``timeout`` seconds."""
    s = ServerProc(*extra, api_key=api_key)
    try:
        s.wait_ready(timeout=timeout)
    except BaseException:
        s.kill()
        raise
    return s


def sse_events(lines) -> list:
    """Parse ``data:`` lines of an SSE body (an iterable of lines) into JSON objects, and "[DONE]"."""
    out = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def dsl_socket(url: str):
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(url)
    return s


def dsl_send(sock, req_id: str, op: str, body: Optional[dict] = None, api_key: Optional[str] = None) -> None:
    import msgspec

    from radixrt.runtime.io_struct import DslRequest

    sock.send(msgspec.msgpack.encode(DslRequest(req_id=req_id, op=op, body=body or {}, api_key=api_key)))


def dsl_recv(sock, timeout_ms: int = 60000):
    import msgspec
    import zmq

    from radixrt.runtime.io_struct import DslReply

    if not sock.poll(timeout_ms, zmq.POLLIN):
        raise TimeoutError("no DSL reply")
    return msgspec.msgpack.decode(sock.recv(), type=DslReply)


def dsl_call(sock, req_id: str, op: str, body: Optional[dict] = None, api_key: Optional[str] = None) -> list:
    """Send one request; return every reply for it up to and including its result/error."""
    dsl_send(sock, req_id, op, body, api_key)
    out = []
    while True:
        r = dsl_recv(sock)
        assert r.req_id in (req_id, ""), r
        out.append(r)
        if r.event in ("result", "error"):
            return out
