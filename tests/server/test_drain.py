"""Graceful drain of ``radixrt serve`` on a real SIGTERM: new calls and /health get 503 at once, running
requests finish (or end with an error after ``--drain-timeout``), and the server exits with status 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from server_util import ServerProc, sse_events, start_server

PROMPT = "The capital of France is"
DRAINING = {
    "error": {"message": "the server is shutting down", "type": "service_unavailable", "param": None, "code": None}
}


def _sigterm_mid_stream(server, sampling: dict, send=None) -> tuple[list, list]:
    """SIGTERM (``send()``) after a stream's first event; returns its events and the (code, body) of calls
    made while draining (/health, /generate)."""
    with server.client() as c:
        with c.stream("POST", "/generate", json={"text": PROMPT, "stream": True, "sampling_params": sampling}) as r:
            lines = r.iter_lines()
            first = sse_events([next(line for line in lines if line.startswith("data:"))])
            (send or (lambda: server.proc.send_signal(signal.SIGTERM)))()
            seen, deadline = [], time.monotonic() + 30
            while True:  # the drain begins in the server's event loop a moment after the signal
                h = c.get("/health")
                if h.status_code == 503:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.02)
            seen.append((h.status_code, h.json()))
            try:  # after a short drain-timeout the server may be gone already
                g = c.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 2}})
                seen.append((g.status_code, g.json()))
            except httpx.TransportError:
                pass
            return first + sse_events(lines), seen


def test_drain_lets_running_requests_finish():
    """Through the Ray Serve replica's retirement path (router/replica.py: drain_server)."""
    from radixrt.runtime.router.replica import drain_server

    server = start_server("--drain-timeout", "60")
    rc: list[int] = []
    retire = threading.Thread(target=lambda: rc.append(drain_server(server.proc, 60)))
    try:
        events, seen = _sigterm_mid_stream(
            server, {"max_new_tokens": 48, "ignore_eos": True, "temperature": 0}, retire.start
        )
        retire.join(timeout=80)
        assert rc == [0]
        assert seen == [(503, DRAINING), (503, DRAINING)]
        assert events[-1] == "[DONE]"
        assert events[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 48}
        assert len(events[-2]["output_ids"]) == 48
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.kill()
    assert "draining 1 requests in flight" in server.logs()
    try:
        httpx.get(server.url + "/health", timeout=2)
        raise AssertionError("the server still answers after its drain")
    except httpx.TransportError:
        pass


def test_drain_timeout_aborts_the_rest():
    server = start_server("--drain-timeout", "0.5")
    try:
        events, seen = _sigterm_mid_stream(server, {"max_new_tokens": 220, "ignore_eos": True})
        assert seen[0] == (503, DRAINING)
        assert events[-1] == "[DONE]" and events[-2] == {
            "error": {
                "message": "the server is shutting down: the request did not finish within --drain-timeout 0.5 s",
                "type": "service_unavailable",
                "param": None,
                "code": None,
            }
        }
        assert server.proc.wait(timeout=60) == 0  # the abort above came from the timeout (its message says so)
    finally:
        server.kill()
    assert "drain timeout (0.5 s): aborting 1 requests" in server.logs()


def test_refused_and_early_aborted_calls_leave_nothing_in_flight():
    """A 400 found while sending (a seed beyond 64 bits: msgpack refuses it) once left its rid counted in
    flight forever, so the drain waited its whole --drain-timeout (30 s). Calls aborted right after sending
    (a constrained one whose grammar may still compile, a plain stream) must not leave one either."""
    import concurrent.futures

    server = start_server()  # --drain-timeout 30 (the default)
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 61}}, "required": ["s"]}
    try:
        with server.client() as c:
            for _ in range(2):  # twice with the same rid: the first must not hold it
                r = c.post(
                    "/generate",
                    json={"text": PROMPT, "rid": "big-seed", "sampling_params": {"max_new_tokens": 1, "seed": 2**64}},
                )
                assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text

            # the abort at three points of the call: sent at once (it may reach the server first: kept as an
            # early abort), once the server counts the call in flight, once the scheduler runs it
            def info():
                return c.get("/get_server_info").json()

            points = (lambda: True, lambda: info()["num_in_flight"] > 0, lambda: info()["num_running"] > 0)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for i, reached in enumerate(points):
                    rid = f"early-{i}"
                    fut = pool.submit(
                        c.post,
                        "/generate",
                        json={
                            "text": PROMPT,
                            "rid": rid,
                            "sampling_params": {"max_new_tokens": 64, "json_schema": schema},
                        },
                    )
                    deadline = time.monotonic() + 30
                    while not (reached() or fut.done()):
                        assert time.monotonic() < deadline, f"{rid}: never reached point {i}"
                        time.sleep(0.005)
                    assert c.post("/abort_request", json={"rid": rid}).json() == {"success": True}
                    out = fut.result().json()
                    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 64
            with c.stream(
                "POST",
                "/generate",
                json={
                    "text": PROMPT,
                    "stream": True,
                    "rid": "stream-early",
                    "sampling_params": {"max_new_tokens": 200},
                },
            ):
                assert c.post("/abort_request", json={"rid": "stream-early"}).json() == {"success": True}
            server.wait_idle()
            st = info()
            assert (st["num_in_flight"], st["num_running"], st["num_waiting"]) == (0, 0, 0), st
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=25) == 0  # within the 30 s drain timeout
    finally:
        server.kill()
    assert "draining" not in server.logs()  # nothing was left in flight to drain: the exit did not wait


def test_sigterm_to_the_process_group_is_a_shutdown_not_a_crash():
    """Ctrl-C or a container stop signals every process of the group: the children die first (their default
    action is at once, the main process's handler runs in its event loop), and the supervisor waits for the
    main process's own drain instead of restarting them."""
    import os

    server = start_server()
    try:
        with server.client() as c:
            pids = c.get("/get_server_info").json()["process_ids"]
        assert set(pids) >= {"main", "scheduler", "detokenizer"}, pids
        # one signal to the whole group at once, as the terminal or the container runtime sends it (the main
        # process has its supervisor's grace, SIGNAL_GRACE_S, from the same instant as the children's deaths)
        os.killpg(server.pgid, signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    finally:
        server.kill()
    logs = server.logs()
    assert "exited unexpectedly" not in logs and "restarting the children" not in logs, logs


def test_sigterm_while_starting_stops_the_children():
    """A stop in the first second, with the children already spawned (before the main process imports its
    HTTP stack) and uvicorn's handlers not yet installed, once killed the main process by the default
    action (status 143) and left the scheduler hung forever in ZMQ's term() on its unsent ready message."""
    import psutil

    server = ServerProc()
    try:
        deadline = time.monotonic() + 120
        while not psutil.Process(server.proc.pid).children():
            assert server.proc.poll() is None and time.monotonic() < deadline, server.logs()
            time.sleep(0.01)
        assert server.stop(timeout=30) == 0  # raises if anything of its process group survives
    finally:
        server.kill()


def test_sigterm_repeated_until_exit_is_still_status_0():
    """A stop signal every 20 ms until the process is gone (an impatient supervisor): each one after the
    first only hurries the stop, and one landing after the clean-up used to meet CPython's finalization,
    which restores the default action (exit -15 while it joined idle threads)."""
    server = start_server()
    try:
        deadline = time.monotonic() + 30
        while server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.02)
        assert server.proc.returncode == 0, server.logs()
        assert "Traceback" not in server.logs()
    finally:
        server.kill()
