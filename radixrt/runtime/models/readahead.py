"""Start reading a model's weight files into the page cache while the process does other start-up work.

A cold start reads the whole file once either way; asking the kernel for it at once
(``posix_fadvise(POSIX_FADV_WILLNEED)``: asynchronous readahead, no copy, nothing in our RSS) lets the disk
stream at its rate while the scheduler process imports torch, converts the tokenizer and sets up the
grammar backend, instead of page faults of the layer-by-layer load pulling 128 KiB at a time later.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)


def weight_files(directory: str, gguf_file: str | None) -> list[str]:
    """The files holding the weights: the GGUF, or a directory's ``*.safetensors``."""
    if gguf_file is not None:
        return [os.path.join(directory, gguf_file)]
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".safetensors"))


def _advise(paths: list[str]) -> None:
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError as e:  # a file system without readahead: the load reads it as before
            logger.debug("no readahead for %s: %s", p, e)
        finally:
            os.close(fd)


def readahead(directory: str, gguf_file: str | None) -> threading.Thread | None:
    """Ask for the weight files' pages on a daemon thread (the call itself can block while it queues the
    reads); returns the thread, or None where ``posix_fadvise`` does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return None
    t = threading.Thread(
        target=_advise, args=(weight_files(directory, gguf_file),), name="weights-readahead", daemon=True
    )
    t.start()
    return t
