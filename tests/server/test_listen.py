"""``radixrt serve`` on a port that is taken: one line naming the flag and exit 2, before any model loads or
child process starts (it was uvicorn's exit 3 after the model had loaded, or, for the DSL port, a
traceback from the app's lifespan)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag", ["--port", "--zmq-port"])
def test_port_in_use_is_one_line_and_exit_2(flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = port + 7 if port < 65000 else port - 7  # the flag not under test: a port nobody holds
        ports = {"--port": port, "--zmq-port": other} if flag == "--port" else {"--port": other, "--zmq-port": port}
        r = subprocess.run([sys.executable, "-m", "radixrt.runtime.server.launch", "serve",
                            "--port", str(ports["--port"]), "--zmq-port", str(ports["--zmq-port"])],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"radixrt: error: cannot listen on 127.0.0.1:{port} ({flag}): address already in use"]
