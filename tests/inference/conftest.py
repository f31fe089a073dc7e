"""Fixtures for the engine tests: the idle-engine check after every test and the HF transformers oracle.

The shared engines live in tests/inference/engines.py (import them from there, never from this file).
"""

from __future__ import annotations

import pytest
import torch

from inference.model_loader import DEFAULT_MODEL, resolve_model
from tests.inference.engines import assert_all_idle, get_llm


@pytest.fixture(autouse=True)
def idle_engine_check():
    """Every test must leave every shared engine idle (no request, no block in use)."""
    yield
    assert_all_idle()


@pytest.fixture(scope="session")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model(DEFAULT_MODEL), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer():
    return get_llm().get_tokenizer()


_hf_greedy_cache: dict[tuple, list[int]] = {}


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    """HF transformers' greedy continuation of some token ids (cached): the oracle our engine must equal."""

    def run(token_ids: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(token_ids), max_new_tokens)
        if key not in _hf_greedy_cache:
            ids = torch.tensor([token_ids])
            with torch.no_grad():
                out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                        do_sample=False, pad_token_id=hf_model.config.eos_token_id)
            _hf_greedy_cache[key] = out[0, len(token_ids):].tolist()
        return _hf_greedy_cache[key]

    return run
