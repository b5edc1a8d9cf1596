"""A C++ AVX2 GEMV over GGUF Q4_1 / Q8_0 blocks (``ggml_gemv.cpp``), built with gcc at first use.

:func:`ggml_gemv` compiles the extension once (``torch.utils.cpp_extension.load``, ``-O3 -mavx2 -mfma
-mf16c``) into ``$RADIXRT_CACHE_DIR/ext/`` (default ``~/.cache/radixrt/ext``); later processes load the
cached ``.so`` in well under a second. It returns ``None``, after one logged warning, where the CPU lacks
AVX2/FMA/F16C or the build fails (no compiler, no ninja); callers then use torch's int4 kernel.

Ops of the loaded library, ``torch.ops.radixrt_ggml`` (fp32 activations are quantized per 32-block to
int8 inside, as llama.cpp does):

- ``q4_1_mm(x [M, K] fp32, w [N, K / 32 * 20] uint8) -> [M, N] fp32``
- ``q8_0_mm(x [M, K] fp32, w [N, K / 32 * 34] uint8) -> [M, N] fp32``
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading

import torch

logger = logging.getLogger(__name__)
_SOURCE = os.path.join(os.path.dirname(__file__), "ggml_gemv.cpp")
_lock = threading.Lock()
_state: dict = {}


def build_dir() -> str:
    root = os.environ.get("RADIXRT_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "radixrt"))
    return os.path.join(root, "ext", f"ggml_gemv-torch{torch.__version__.split('+')[0]}")


def _cpu_ok() -> bool:
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f" {f}" in flags for f in ("avx2", "fma", "f16c"))


def ggml_gemv():
    """``torch.ops.radixrt_ggml`` once the library is built and loaded, or ``None`` where it cannot be
    built here (a warning says why)."""
    with _lock:
        if "mod" not in _state:
            _state["mod"] = _build()
        return _state["mod"]


def _build():
    if os.environ.get("RADIXRT_DISABLE_CPP_KERNELS"):
        return None
    if not _cpu_ok():
        logger.warning("ggml_gemv: CPU lacks AVX2/FMA/F16C; using torch's int4 kernel")
        return None
    from torch.utils.cpp_extension import load

    d = build_dir()
    os.makedirs(d, exist_ok=True)
    try:
        # An flock dies with its process; torch's own lock file does not, and a build killed midway would
        # leave it behind for every later process to wait on. Holding the flock, no other radixrt process
        # is building, so a leftover torch lock is stale.
        with open(os.path.join(d, "radixrt.flock"), "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(d, "lock")):
                os.remove(os.path.join(d, "lock"))
            load("radixrt_ggml_gemv", [_SOURCE], build_directory=d, verbose=False, is_python_module=False,
                 extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c"])
        return torch.ops.radixrt_ggml
    except Exception as e:  # noqa: BLE001 - any build failure means: use torch's kernel
        logger.warning("ggml_gemv: C++ build failed (%s); using torch's int4 kernel", str(e).splitlines()[0][:300])
        return None
