"""A GGUF's config and tokenizer, converted once by transformers and kept as small files.

Converting a 128k-token vocabulary from GGUF metadata into a fast tokenizer takes seconds (transformers
builds it in Python); every later load reads the converted ``tokenizer.json`` instead, and the server's
detokenizer reads only that file (with ``tokenizers``, no transformers, no torch). No weights are kept.

Trust: a directory is used only if this code wrote it. Its name is keyed on the GGUF's size, mtime (ns) and
a blake2b of its whole header (metadata and tensor table, :mod:`.gguf_header`; milliseconds, recomputed at
every load), so a changed file is converted again; and it holds ``manifest.json``, the blake2b of every
file it holds, written last and checked file by file before any use. A directory that fails the check (a
partial write, a file edited or added by hand) is removed and converted again. The manifest guards against
corruption and stale or foreign files, not against someone who can write the cache and recompute hashes.
``RADIXRT_CACHE_DIR`` overrides the location (default ``~/.cache/radixrt``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from radixrt.runtime.models.gguf_header import read_header

MANIFEST = "manifest.json"


def cache_dir(gguf_path: str) -> str:
    """The cache directory for ``gguf_path`` (not created). ValueError naming a file that is not a GGUF."""
    st = os.stat(gguf_path)
    root = os.environ.get("RADIXRT_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "radixrt"))
    digest = header_digest(os.path.realpath(gguf_path))
    return os.path.join(root, "meta", f"{os.path.basename(gguf_path)}-{st.st_size}-{st.st_mtime_ns}-{digest}")


def header_digest(path: str) -> str:
    """blake2b (16 hex digits) of the file's header bytes; ValueError naming a file that is not a GGUF.
    Computed at every call, never memoized: a file rewritten in place must not match."""
    n = read_header(path).header_bytes
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(n), digest_size=8).hexdigest()


def _file_hash(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read(), digest_size=16).hexdigest()


def _hashes(d: str) -> dict[str, str]:
    return {f: _file_hash(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f != MANIFEST}


def verified(d: str) -> bool:
    """True when ``d`` holds a manifest and exactly the files it names, each with its recorded hash."""
    try:
        with open(os.path.join(d, MANIFEST)) as f:
            want = json.load(f)
        return isinstance(want, dict) and bool(want) and _hashes(d) == want
    except (OSError, ValueError):
        return False


def ensure_converted(gguf_path: str, in_child: bool = False) -> str:
    """The verified cache directory of ``gguf_path`` (``config.json``, ``tokenizer.json``,
    ``tokenizer_config.json``, ...), converting through transformers when it is missing or fails the check.
    ``in_child``: convert in a child Python process that then exits (transformers' GGUF reader needs torch,
    which a tokenizer-only process, :func:`~.loader.tokenizer_only_transformers`, does not load).

    Raises:
        ValueError: the file is not a readable GGUF (truncated, corrupt or foreign); names the file.
    """
    cache = cache_dir(gguf_path)
    if verified(cache):
        return cache
    shutil.rmtree(cache, ignore_errors=True)  # absent, partial or altered: never read, convert again
    if in_child:
        return _convert_in_child(gguf_path, cache)
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    directory, name = os.path.split(os.path.abspath(gguf_path))
    tmp = f"{cache}.tmp{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    try:
        AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(tmp)
        cfg = AutoConfig.from_pretrained(directory, gguf_file=name)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: say which, not the reader's trace
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"{gguf_path}: not a readable GGUF file (truncated or corrupt? {type(e).__name__}: {str(e)[:200]})"
        ) from None
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.save_pretrained(tmp)
    with open(os.path.join(tmp, MANIFEST), "w") as f:  # last: a directory without it is never used
        json.dump(_hashes(tmp), f, indent=1)
    try:
        os.rename(tmp, cache)  # atomic: concurrent loaders never see half a directory
    except OSError:  # another process won the race; its directory is checked like any other
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


def _convert_in_child(gguf_path: str, cache: str) -> str:
    import subprocess
    import sys

    code = (
        "import sys\nfrom radixrt.runtime.models.meta_cache import ensure_converted\ntry:\n"
        "    ensure_converted(sys.argv[1])\nexcept ValueError as e:\n    print(e, file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, gguf_path], capture_output=True, text=True)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        raise ValueError(
            lines[-1]
            if r.returncode == 2 and lines
            else f"{gguf_path}: converting its metadata failed (exit {r.returncode}): {r.stderr[-300:]}"
        )
    if not verified(cache):
        raise ValueError(f"{gguf_path}: its converted metadata in {cache} fails its manifest check")
    return cache
