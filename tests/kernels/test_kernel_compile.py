"""The Triton kernels compile for a real GPU target (sm_90), which the interpreter never checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def compile_for_hopper(*dtypes: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(HERE.parents[1]),
           "TRITON_DEFAULT_FP_FUSION": "1"}
    result = subprocess.run([sys.executable, str(HERE / "compile_for_hopper.py"), *dtypes], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_kernels_compile_for_hopper_in_bf16():
    assert compile_for_hopper("bf16").count("compiled all kernels for sm_90: bf16") == 2


@pytest.mark.slow
def test_kernels_compile_for_hopper_in_fp32_and_fp16():
    output = compile_for_hopper("fp32", "fp16")
    assert output.count("compiled all kernels") == 4
