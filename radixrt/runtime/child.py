"""What every child process of ``radixrt serve`` does at start and while it polls (the scheduler, the
detokenizer, the ``--tp`` ranks): one place, so that no child imports another child's module."""

from __future__ import annotations

import logging
import os
import signal
import sys

IDLE_POLL_MS = 200  # block this long on a socket when there is nothing to do (the parent check period)


def setup_child(log_level: str, name: str) -> None:
    """Common start of a child process: logging to stderr tagged with ``name``, Ctrl-C left to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C reaches the whole group
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s"
    )


def parent_alive(parent_pid: int) -> bool:
    """True while the process that started this one (pid ``parent_pid``) is still its parent."""
    return os.getppid() == parent_pid
