"""Fixtures for the benchmark tests: the default model's tokenizer, loaded once (no engine needed for it)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inference.model_loader import DEFAULT_MODEL, resolve_model


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
