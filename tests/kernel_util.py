"""The one gate for tests of the C++ kernels: they are skipped only where the kernels cannot exist (a CPU
without AVX2/FMA/F16C, or RADIXRT_DISABLE_CPP_KERNELS set); on a capable CPU a failed build fails the test
with the build's error."""

from __future__ import annotations

import os

import pytest

from radixrt.kernels import cpp

CAN_BUILD = cpp.cpu_ok() and not os.environ.get("RADIXRT_DISABLE_CPP_KERNELS")
needs_cpp = pytest.mark.skipif(
    not CAN_BUILD, reason="no AVX2/FMA/F16C, or RADIXRT_DISABLE_CPP_KERNELS is set: the C++ kernels cannot run here"
)


def built(namespace: str = "radixrt_attn"):
    """``torch.ops.<namespace>``; fails (not skips) when the build failed on a CPU that supports it."""
    ops = cpp.ops(namespace)
    assert ops is not None, f"radixrt_cpu failed to build on a capable CPU: {cpp.build_error()}"
    return ops


@pytest.fixture(autouse=True, scope="module")
def _kernels_built():
    """Imported into a test module (``from kernel_util import _kernels_built``), checks the build once."""
    if CAN_BUILD:
        built()
