"""Build and load radixrt's C++ CPU kernels (``torch.utils.cpp_extension``, gcc) once, at first use.

All sources in :data:`SOURCES` compile into one library, ``radixrt_cpu``, in
``$RADIXRT_CACHE_DIR/ext/radixrt_cpu-torch<version>-<hash>/`` (default ``~/.cache/radixrt``) with :data:`FLAGS`; later
processes load the cached ``.so`` directly (``built.ok`` marks a build that loaded). The hash covers the sources'
contents, the flags and torch's install folder (each virtualenv its own build), and the build compiles copies of the
sources inside that directory: checkouts with the same kernels share one build, and a changed kernel never loads a stale
one. Each source registers its own op namespace (``torch.ops.radixrt_ggml``, ``radixrt_attn``, ``radixrt_fused``,
``radixrt_gemv``, ``radixrt_layer``). The kernels split their work over radixrt's own thread pool (``parallel.h``, sized
by ``torch.get_num_threads()`` at first use); OpenMP, for its fallback ``at::parallel_for``, resolves to the
``libgomp.so.1`` torch has already loaded.

:func:`ops` returns ``None``, after one logged warning, where the CPU lacks AVX2/FMA/F16C, where
``RADIXRT_DISABLE_CPP_KERNELS`` is set, or where the build fails (no compiler, no ninja); callers then run
their torch path.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import logging
import os
import shutil
import threading

import torch

logger = logging.getLogger(__name__)
_HERE = os.path.dirname(__file__)
# every kernel folder's sources and headers (sorted, so the build hash is the same in every checkout)
SOURCES = sorted(glob.glob(os.path.join(_HERE, "*", "*.cpp")))
HEADERS = sorted(glob.glob(os.path.join(_HERE, "*.h")) + glob.glob(os.path.join(_HERE, "*", "*.h")))
# no FMA contraction: where a kernel mirrors torch's separate multiply and add it must round as torch does
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"]
_lock = threading.Lock()
_state: dict = {}  # "ok": the library loaded; namespace -> torch.ops namespace or None


def build_dir() -> str:
    root = os.environ.get("RADIXRT_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "radixrt"))
    # torch's own location is in the compile commands (its include paths): two virtualenvs sharing this
    # cache would otherwise rebuild each other's library on every load
    h = hashlib.sha256((" ".join(FLAGS) + "\0" + os.path.dirname(torch.__file__)).encode())
    for path in SOURCES + HEADERS:
        h.update(os.path.relpath(path, _HERE).encode() + b"\0" + open(path, "rb").read())
    return os.path.join(root, "ext", f"radixrt_cpu-torch{torch.__version__.split('+')[0]}-{h.hexdigest()[:12]}")


def _copy_sources(d: str) -> list[str]:
    """The sources copied under ``d/src`` (their relative layout kept, for the ``#include "../avx2.h"``)."""
    out = []
    for path in SOURCES + HEADERS:
        dst = os.path.join(d, "src", os.path.relpath(path, _HERE))
        if not os.path.exists(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(path, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
        out.append(dst)
    return out[: len(SOURCES)]


def cpu_ok() -> bool:
    """True where the CPU has AVX2, FMA and F16C (what every kernel here is written for)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f" {f}" in flags for f in ("avx2", "fma", "f16c"))


def ops(namespace: str):
    """``torch.ops.<namespace>`` once the library is built and loaded, else ``None``. Cheap after the first
    call (no lock): the fused ops call it once per layer."""
    if namespace not in _state:
        with _lock:
            if "ok" not in _state:
                _state["ok"] = _build()
            _state[namespace] = getattr(torch.ops, namespace) if _state["ok"] else None
    return _state[namespace]


def build_error() -> str | None:
    """Why the library is not loaded (the build's first error line), or ``None`` if it loaded or was never
    asked for. The tests report it, so that a failed build on a capable CPU is a failure and not a skip."""
    return _state.get("error")


def _build() -> bool:
    if os.environ.get("RADIXRT_DISABLE_CPP_KERNELS"):
        return False
    if not cpu_ok():
        logger.warning("radixrt_cpu: CPU lacks AVX2/FMA/F16C; using the torch paths")
        return False
    d = build_dir()
    built = os.path.join(d, "built.ok")  # written after a load through cpp_extension succeeded
    if os.path.exists(built):
        # the directory is keyed on the sources, flags and torch: its library is current. Loaded as it is,
        # without cpp_extension's import and its ninja run, which check just that on every start
        try:
            torch.ops.load_library(os.path.join(d, "radixrt_cpu.so"))
            return True
        except Exception as e:  # noqa: BLE001 - built again below
            logger.warning("radixrt_cpu: the cached library does not load (%s); building it again", e)
            with contextlib.suppress(FileNotFoundError):  # another process may have removed it
                os.remove(built)
    from torch.utils.cpp_extension import load

    os.makedirs(d, exist_ok=True)
    try:
        # An flock dies with its process; torch's own lock file does not, and a build killed midway would
        # leave it behind for every later process to wait on. Holding the flock, no other radixrt process
        # is building, so a leftover torch lock is stale.
        with open(os.path.join(d, "radixrt.flock"), "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(d, "lock")):
                os.remove(os.path.join(d, "lock"))
            load(
                "radixrt_cpu",
                _copy_sources(d),
                build_directory=d,
                verbose=False,
                is_python_module=False,
                extra_cflags=FLAGS,
                extra_ldflags=["-fopenmp"],
            )
        open(built, "w").close()
        return True
    except Exception as e:  # noqa: BLE001 - any build failure means: use the torch paths
        _state["error"] = (str(e).splitlines() or [type(e).__name__])[0][:300]
        logger.warning("radixrt_cpu: C++ build failed (%s); using the torch paths", _state["error"])
        return False
