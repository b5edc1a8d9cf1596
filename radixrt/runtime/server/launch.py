"""``radixrt serve``: start the three processes and the HTTP + DSL front ends.

    radixrt serve [--model M] [--host 127.0.0.1] [--port 30000] [--zmq-port PORT+1] [--api-key K] ...
    radixrt profile LOG ...              (replay a request log through the radix tree: profile_cmd.py)
    python -m radixrt serve ...          python -m radixrt.runtime.server.launch serve ...

- main process: FastAPI on uvicorn (uvloop), the TokenizerManager and the DSL's ZMQ ROUTER;
- scheduler process (model, KV pool, radix tree) and detokenizer process, started with multiprocessing's
  "spawn" context and wired with ZMQ over ``ipc://`` paths in a private temporary folder; started first,
  before this process imports transformers and the HTTP stack, so the model loads meanwhile;
- HTTP is up at once: ``/health`` answers 503 until the model is loaded, then 200; at that moment exactly
  one line is printed on stdout:
  ``radixrt ready: http://127.0.0.1:30000 (zmq tcp://127.0.0.1:30001) model=SmolLM2-135M-Instruct``;
- Ctrl-C or SIGTERM: a drain (manager/admission.py): new calls and ``/health`` get 503, running requests
  finish for up to ``--drain-timeout`` seconds, the rest end with an error; then the children are
  terminated (SIGTERM, then SIGKILL) and joined, the IPC folder is removed, and the exit status is 0. A
  second signal skips what is left of the drain.
- A child that dies is restarted (manager/supervisor.py), at most ``--max-restarts`` times in 10 min. The children also
  exit on their own when the main process
  disappears (they poll their parent pid), so a SIGKILLed server leaves no orphans.
- If the model fails to load, the server prints the reason on stderr and exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
import socket
import sys
import threading
from typing import Optional

from radixrt.runtime.config import ServerArgs

logger = logging.getLogger("radixrt.server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description="radixrt: a prefix-caching LLM runtime")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible and SGLang-native server",
        description="Run the server: OpenAI-compatible and SGLang-native HTTP APIs, plus the DSL's ZMQ socket.",
    )
    ServerArgs.add_cli_args(serve)
    from radixrt.runtime.server.cli.profile_cmd import add_parser as add_profile_parser

    add_profile_parser(sub)
    parser.set_defaults(serve_parser=serve)  # its usage line goes with a bad serve argument
    return parser


def _as_flag(message: str) -> str:
    """A ``ServerArgs`` error as the command line spells it: its leading field name as the flag
    (``speculative_num_draft_tokens must be ...`` -> ``--speculative-num-draft-tokens must be ...``)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ServerArgs)}

    def flag(m: re.Match) -> str:  # a one-word field ("port") only where it leads: elsewhere it is prose
        word = m.group()
        return "--" + word.replace("_", "-") if word in fields and ("_" in word or m.start() == 0) else word

    return re.sub(r"\b[a-z][a-z0-9_]*\b", flag, message)


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "profile":
        from radixrt.runtime.server.cli.profile_cmd import run as run_profile

        return run_profile(ns)
    if ns.command != "serve":
        parser.print_help()
        return 2
    try:
        args = ServerArgs.from_cli_args(ns)
    except ValueError as e:
        ns.serve_parser.error(_as_flag(str(e)))
    if args.dp > 1:
        from radixrt.runtime.router.launch import serve_dp

        return serve_dp(args)
    rank = int(os.environ.get("RANK", 0))
    if args.tp > 1 and rank > 0:  # torchrun: ranks > 0 run only a lockstep scheduler; rank 0 serves
        import msgspec

        from radixrt.runtime.scheduler.tp_lockstep import run_worker

        run_worker(msgspec.json.encode(args), rank, args.tp, None)
        return 0
    return serve(args)


def serve(args: ServerArgs) -> int:
    """Run the server until Ctrl-C / SIGTERM. Returns the exit status."""
    from radixrt.runtime.models.loader import resolve_model

    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="[%(asctime)s main] %(levelname)s %(name)s: %(message)s"
    )
    children = None
    try:  # before the model loads: a port in use is one line and exit 2, not an exit 3 seconds later
        http_sock = _listen(args.host, args.port, "--port")
        _listen(args.host, args.dsl_port, "--zmq-port").close()  # zmq binds it itself, once started
    except ValueError as e:
        print(f"radixrt: error: {e}", file=sys.stderr)
        return 2
    early = _EarlySignal()  # until uvicorn's handlers: a stop then must not orphan started children
    try:  # a bad path or file fails here with one line (the children, if started, are stopped first)
        src = resolve_model(args.model)
        from radixrt.runtime.models.readahead import readahead

        readahead(src.directory, src.gguf_file)  # the disk streams while the children start (cold page cache)
        children = _start_children_early(args, src)
        from radixrt.runtime.models.loader import load_config, tokenizer_only_transformers

        tokenizer_only_transformers()  # this process runs no model: torch's memory and import time kept out
        load_config(args.model)
    except ValueError as e:
        if children is not None:
            children.stop()
        print(f"radixrt: error: {e}", file=sys.stderr)
        return 2
    from radixrt.runtime.server.native.dsl_socket import DslServer
    from radixrt.runtime.server.http_server import create_app
    from radixrt.runtime.server.manager.tokenizer_manager import TokenizerManager

    metrics = None
    if args.enable_metrics:
        from radixrt.runtime.server.observe.metrics import Metrics

        metrics = Metrics(args.served_model_name or src.name)
    holder: dict = {}
    tm = TokenizerManager(args, src.name, metrics, children, on_fatal=lambda: _stop(holder))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await tm.start()
        dsl = DslServer(args, tm)
        try:
            await dsl.start()
        except Exception as e:
            tm.stop_processes()
            raise RuntimeError(f"cannot bind the DSL socket {dsl.address}: {e}") from e
        announce = asyncio.create_task(_announce(args, tm, holder, dsl.address))
        try:
            yield
        finally:
            announce.cancel()
            await dsl.stop()
            await tm.shutdown()

    app = create_app(args, tm, metrics, lifespan=lifespan)
    import uvicorn  # after the children started (serve's imports delay them otherwise)

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="auto",
        log_level="debug" if args.log_level == "debug" else "warning",
        access_log=args.log_level == "debug",
        lifespan="on",
        timeout_graceful_shutdown=3,
        timeout_keep_alive=30,
    )
    server = _server_class()(config, tm, args.drain_timeout)
    holder["server"] = server
    early.stops(server)
    if early.signalled:  # stopped while starting: the children go, and it is still a clean stop
        tm.stop_processes()
        return 0
    try:
        server.run(sockets=[http_sock])
    finally:
        tm.stop_processes()
    if tm.fatal is not None:
        print(f"radixrt: error: {tm.fatal}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


def _start_children_early(args: ServerArgs, src):
    """Start the scheduler and detokenizer now, before this process imports transformers and the HTTP
    stack (a large part of a cold start, docs/measurements.md), when the GGUF's converted metadata is
    already cached and verified (:mod:`~radixrt.runtime.models.meta_cache`): otherwise this process
    converts it first, as before, so that the three processes never convert it at once. None when not
    started. ValueError: not a GGUF."""
    if src.gguf_file is None:
        return None
    from radixrt.runtime.models.meta_cache import cache_dir, verified

    if not verified(cache_dir(os.path.join(src.directory, src.gguf_file))):
        return None
    from radixrt.runtime.server.manager.child_processes import ChildProcesses

    children = ChildProcesses(args)
    children.spawn()
    return children


def _listen(host: str, port: int, flag: str) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (``SO_REUSEADDR``, as uvicorn binds), for uvicorn to serve on.

    Raises:
        ValueError: the address cannot be bound (in use, not this machine's, no permission), naming ``flag``.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port} ({flag}): {e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        reason = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise ValueError(f"cannot listen on {host}:{port} ({flag}): {reason}") from None
    sock.set_inheritable(False)
    return sock


class _EarlySignal:
    """SIGINT/SIGTERM before uvicorn installs its own handlers (``_Server.capture_signals``): remembered, so
    that ``serve`` stops the children it may already have started and exits 0, instead of the default
    action killing this process and leaving them behind. Only in the main thread (where signals land)."""

    def __init__(self):
        self.signalled = False
        self.server = None  # the uvicorn Server, once made
        self.install()

    def stops(self, server) -> None:
        """From now on a signal stops the uvicorn ``server`` (until uvicorn installs its own handlers)."""
        self.server = server

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._handle)

    def _handle(self, sig, frame) -> None:
        self.signalled = True
        if self.server is not None:  # between the check in serve and uvicorn's handlers
            self.server.should_exit = True


def _stop(holder: dict) -> None:
    """The TokenizerManager's ``on_fatal``: uvicorn's server (in ``holder`` once made) stops serving."""
    server = holder.get("server")
    if server is not None:
        server.should_exit = True


async def _announce(args: ServerArgs, tm, holder: dict, zmq_address: str) -> None:
    """Print the one ready line once the model is loaded and HTTP is listening."""
    await tm.ready.wait()
    server = holder["server"]
    while not server.started:
        await asyncio.sleep(0.02)
    host = args.host if ":" not in args.host else f"[{args.host}]"
    print(
        f"radixrt ready: http://{host}:{args.port} (zmq {zmq_address.replace('*', args.host)}) model={tm.model_name}",
        flush=True,
    )


def _server_class():
    """uvicorn's Server with our signal handling, defined at first use: importing uvicorn at module level
    would delay the start of the children by its import."""
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's Server with our own SIGINT/SIGTERM handling: drain (running requests finish for up to
        ``drain_timeout`` seconds, the rest end with an error event), shut down, and return normally (uvicorn
        would re-raise the signal after shutting down, which skips the clean-up after ``run``). A second signal
        ends the drain at once; a third Ctrl-C forces the exit."""

        def __init__(self, config, tm, drain_timeout: float = 0.0):
            super().__init__(config)
            self.tm = tm
            self.drain_timeout = drain_timeout
            self.draining = False

        @contextlib.contextmanager
        def capture_signals(self):
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop yet (still starting)
                self.should_exit = True
                return
            if not self.draining and self.started and self.tm.ready is not None and self.tm.ready.is_set():
                self.draining = True
                loop.call_soon_threadsafe(self._drain)
                return
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            loop.call_soon_threadsafe(self.tm.begin_shutdown)

        def _drain(self) -> None:
            from radixrt.runtime.server.manager.admission import drain

            self._drain_task = asyncio.get_running_loop().create_task(drain(self.tm, self.drain_timeout, self._stop))

        def _stop(self) -> None:
            self.should_exit = True
            self.tm.begin_shutdown()

    return _Server


def cli() -> None:
    """The ``radixrt`` command: :func:`main`, then exit at once with its status. Once ``main`` returns, the
    stop is complete (children stopped, IPC folder removed): a second SIGTERM then is ignored instead of
    killing the interpreter's finalization (CPython restores the default action, exit -15, and joins idle
    pool threads first)."""
    code = main()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    cli()
