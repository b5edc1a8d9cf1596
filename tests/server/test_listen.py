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
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "radixrt.runtime.server.launch",
                "serve",
                "--port",
                str(ports["--port"]),
                "--zmq-port",
                str(ports["--zmq-port"]),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"radixrt: error: cannot listen on 127.0.0.1:{port} ({flag}): address already in use"
    ]


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--port", "30010", "--zmq-port", "30010"], "--zmq-port must differ from port (30010): they are two sockets"),
        (["--port", "0"], "--port must be an integer in 1..65535, got 0"),
        (["--port", "70000"], "--port must be an integer in 1..65535, got 70000"),
        (["--port", "65535"], "--zmq-port defaults to port + 1 = 65536: give a --zmq-port in 1..65535"),
        (
            ["--dtype", "bfloat16", "--quantization", "q4"],
            "--quantization 'q4' runs on fp32 activations; with dtype 'bfloat16' the weights stay bfloat16 "
            "('auto' or 'none')",
        ),
        (["--speculative-num-draft-tokens", "0"], "--speculative-num-draft-tokens must be a positive integer, got 0"),
        (["--num-threads", "0"], "--num-threads must be a positive integer (or unset: every core), got 0"),
        (
            ["--speculative-num-draft-tokens", "65"],
            "--speculative-num-draft-tokens must be <= 64 (the step-time curve's last measured size), got 65",
        ),
    ],
)
def test_bad_arguments_are_one_line_naming_the_flag(argv, line):
    """Refused before anything starts, under ``radixrt serve``'s usage, with the flag as typed (the same
    port twice once served nothing: one socket took both; --port 0 printed port 0 and put ZMQ on port 1;
    bf16 with q4 silently ran bf16 while /get_server_info said q4)."""
    r = subprocess.run([sys.executable, "-m", "radixrt", "serve", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0].startswith("usage: radixrt serve ")
    assert r.stderr.splitlines()[-1] == f"radixrt serve: error: {line}"


def test_ipv6_loopback_serves_http_and_the_dsl_socket():
    """``--host ::1``: HTTP and the DSL's ZMQ socket both listen there (ZMQ refused IPv6 without its
    option: a lifespan traceback and exit 3 after the model loaded)."""
    import httpx

    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixrt",
            "serve",
            "--host",
            "::1",
            "--port",
            str(port),
            "--zmq-port",
            str(port + 1 if port < 65535 else port - 1),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = proc.stdout.readline()
        assert ready.startswith(f"radixrt ready: http://[::1]:{port} (zmq tcp://[::1]:"), proc.stderr.read()
        r = httpx.post(
            f"http://[::1]:{port}/generate",
            json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
        zport = int(ready.split("(zmq tcp://[::1]:")[1].split(")")[0])
        socket.create_connection(("::1", zport), timeout=10).close()  # the ROUTER listens on IPv6 too
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
