"""Fixtures for the benchmark tests: the default model's tokenizer, loaded once (no engine needed for it).

The kernel bench's CPU smoke times Triton through its interpreter, which ``triton.jit`` picks at decoration time,
so TRITON_INTERPRET is set here, before any test imports ``kernels.triton_kernels`` (as tests/kernels does).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from inference.model_loader import DEFAULT_MODEL, resolve_model  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
