"""Kernel tests: Triton runs through its CPU interpreter unless a GPU run opts out with TRITON_INTERPRET=0.

``triton.jit`` decides at decoration time whether a kernel is interpreted, so the variable is set here,
before any test module imports ``kernels.triton_kernels``.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from types import ModuleType  # noqa: E402


@pytest.fixture(scope="session")
def device() -> torch.device:
    """CUDA when a GPU is present and the interpreter is off; the CPU otherwise."""
    if torch.cuda.is_available() and os.environ["TRITON_INTERPRET"] != "1":
        return torch.device("cuda")
    return torch.device("cpu")


@pytest.fixture(scope="session")
def triton_ops(device: torch.device) -> ModuleType:
    """``kernels.triton_kernels``, checked to be runnable on ``device``."""
    from kernels import triton_kernels

    if device.type == "cpu" and not triton_kernels.INTERPRETED:
        pytest.fail("kernels.triton_kernels was imported before TRITON_INTERPRET=1 was set, so its kernels "
                    "cannot run on the CPU; run the kernel tests on their own or set TRITON_INTERPRET=1")
    return triton_kernels
