"""A benchmarked server as a child process: its own process group (``start_new_session``), its stdout and
stderr in files under a fresh temporary folder, ready once an HTTP path answers 200."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``cmd`` started now; ``what`` names it in errors, ``prefix`` its log folder's name."""

    def __init__(self, cmd: list[str], what: str, prefix: str, cwd: Optional[Path] = None):
        self.what = what
        self.logdir = tempfile.mkdtemp(prefix=prefix)
        with (
            open(os.path.join(self.logdir, "stdout"), "w") as out,
            open(os.path.join(self.logdir, "stderr"), "w") as err,
        ):
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, start_new_session=True)

    def tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of its stderr."""
        return Path(self.logdir, "stderr").read_text()[-n:]

    def wait_ready(self, url: str, timeout: float, poll: float = 0.3) -> None:
        """Until ``GET url`` answers 200 (a loading server answers 503, or nothing). Raises RuntimeError, its
        group killed, when it exits first or is not ready within ``timeout`` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(url, timeout=5, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(poll)
        self.kill()
        raise RuntimeError(f"{self.what} not ready after {timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL to the whole group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the whole group; SIGKILL after ``timeout`` seconds."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            self.kill()

    def shutdown(self, timeout: float = 30) -> None:
        """SIGTERM to the leader alone, for a server that stops its own children (``radixrt serve``); its logs
        removed. Raises RuntimeError, the group killed, when the leader is not gone within ``timeout`` seconds or
        anything of its group outlives it by as long (orphans)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.what} did not stop on SIGTERM within {timeout:.0f} s\n{self.tail()}")
        deadline = time.time() + timeout
        while self.group_alive():
            if time.time() > deadline:
                self.kill()
                raise RuntimeError(f"processes of {self.what}'s group survived its exit (orphans)")
            time.sleep(0.1)
        shutil.rmtree(self.logdir, ignore_errors=True)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
