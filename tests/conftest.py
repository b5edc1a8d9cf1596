"""Shared fixtures. The model loads once per session (the ``engine`` fixture; a GGUF's tensors are views of
its memory map, opened once per process). After every test, every live engine
must satisfy free + evictable + protected (+ private, while busy) = total pages, with all locks released."""

from __future__ import annotations

import os

# Idle OpenMP workers sleep instead of spinning, so the test process, a server's scheduler process and
# the reference model do not fight over the 2 cores (set before torch is imported).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import time
from pathlib import Path

import pytest
import torch

from radixrt.runtime.models.loader import load_hf_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
_ENGINES: list = []


# The test corpora, inside the repository (tests/data/README.md names each source and licence).
DATA = ROOT / "tests" / "data"


def make_engine(**kw):
    from radixrt import Engine

    kw.setdefault("max_total_tokens", 8192)
    # The parity tests compare token for token with HF fp32, so they run the GGUF dequantized to fp32
    # (the default for a GGUF is its own 4-bit blocks); tests/test_quant.py asks for each format itself.
    kw.setdefault("quantization", "none")
    e = Engine(**kw)
    _ENGINES.append(e)
    return e


def close_engine(e) -> None:
    e.shutdown()
    if e in _ENGINES:
        _ENGINES.remove(e)


def wait_idle(e, timeout: float = 30.0) -> dict:
    """Wait until the engine has no running or waiting request nor store to tier 2 in flight, then check the
    pool accounting."""
    deadline = time.time() + timeout
    while True:
        info = e.get_server_info()
        if info["num_running"] == 0 and info["num_waiting"] == 0 and not info["cache"].get("storing_pages"):
            break
        if time.time() > deadline:
            raise AssertionError(f"engine not idle after {timeout}s: {info}")
        time.sleep(0.05)
    return e.check_invariants()


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_running():
    """At the end of the session, after every other fixture's teardown (it is set up first, so torn down
    last): fail if an Engine was never shut down (its scheduler thread still runs) or a process that a
    test started is still alive. Leftover processes are killed so they do not outlive the run."""
    import threading

    import psutil

    yield
    engines = [t for t in threading.enumerate() if t.name == "radixrt-scheduler" and t.is_alive()]
    # multiprocessing's resource tracker is this interpreter's own helper (it ends with pytest), not a test's
    children = [
        p
        for p in psutil.Process().children(recursive=True)
        if "multiprocessing.resource_tracker" not in " ".join(_cmdline(p))
    ]
    _, alive = psutil.wait_procs(children, timeout=15)  # a server just stopped may still be exiting
    described = []
    for p in alive:
        try:
            described.append(f"pid {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.kill()
        except psutil.Error:
            pass
    assert not engines, f"{len(engines)} Engine(s) never shut down"
    assert not described, "processes still alive at the end of the session:\n" + "\n".join(described)


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """A test that changes torch's thread count must set it back: every later model run in this process would
    otherwise run on that many cores (test_tp_gguf once left it at 1)."""
    import torch

    before = torch.get_num_threads()
    yield
    assert torch.get_num_threads() == before, f"torch threads {before} -> {torch.get_num_threads()}: not restored"


@pytest.fixture(autouse=True)
def _pool_invariants():
    yield
    for e in list(_ENGINES):
        st = wait_idle(e)
        assert st["private_pages"] == 0
        assert st["free_pages"] + st["evictable_pages"] + st["protected_pages"] == st["total_pages"]
        assert st["protected_pages"] == 0, "a lock_ref stayed above 0"


@pytest.fixture(scope="session")
def cpp_kernels_loaded():
    """The C++ kernels loaded into this process from the usual cache (built there if they are not yet).
    A test that points ``RADIXRT_CACHE_DIR`` at a temporary directory (for the GGUF metadata cache) asks for
    this first: were it the process's first user of the kernels, their cache would move there too and the
    whole library be built again (minutes on 2 cores; it took 167-237 s in test_gguf_f16 on a busy box)."""
    from radixrt.kernels import cpp

    cpp.ops("radixrt_attn")  # builds or loads the one library that holds every namespace


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def engine():
    e = make_engine()
    yield e
    close_engine(e)


@pytest.fixture(scope="session")
def hf_model():
    torch.manual_seed(0)
    return load_hf_model()


@pytest.fixture(scope="session")
def passage_ids(tokenizer) -> list[int]:
    return tokenizer.encode((ROOT / "tests" / "data" / "passage.txt").read_text(), add_special_tokens=False)


def hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=2,
            eos_token_id=None,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="session")
def api_server():
    """One plain ``radixrt serve`` shared by tests/server/test_server.py (its ``server``) and the
    API-compatibility modules (SGLang frontend, compatibility table, OpenAPI fuzz); each of them checks the
    pool after every test with ``api_server.wait_idle()``. Every test that reads the radix cache's counters
    flushes it first, so none depends on what ran before it."""
    from server_util import start_server

    s = start_server()
    yield s
    assert s.stop() == 0, s.logs()  # stop() raises if anything of its process group survives
    assert not s.group_alive()
