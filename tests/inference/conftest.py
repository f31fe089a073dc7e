"""Shared engines and the HF transformers oracle for the engine tests.

Loading a model takes seconds, so engines are built once per configuration and shared; every test that
uses one must leave it idle, which the `idle_engine_check` fixture asserts after the test.
"""

from __future__ import annotations

import pytest
import torch

from inference import LLM
from inference.model_loader import DEFAULT_MODEL, resolve_model

# Eight prompts of clearly different lengths (2 to ~150 tokens) for the greedy oracle.
ORACLE_PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4, 5,",
    "Explain in one sentence why the sky is blue to a curious child who keeps asking questions.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest was "
    "proud, the second was clever, and the youngest was kind. One day a stranger came to the castle and",
    " ".join(f"Item {i}: a line of a long shopping list with apples, pears and bread." for i in range(10)),
]

_engines: dict[tuple, LLM] = {}


def get_llm(**kwargs) -> LLM:
    """An engine for this configuration, built on first use (small KV pools keep memory modest).

    float32 unless a test asks otherwise: it is the oracle mode that must equal HF transformers token for
    token (the CPU default is bfloat16 where the CPU has it natively).
    """
    kwargs.setdefault("num_kv_blocks", 256)
    kwargs.setdefault("dtype", "float32")
    key = tuple(sorted(kwargs.items()))
    if key not in _engines:
        _engines[key] = LLM(**kwargs)
    return _engines[key]


def assert_idle(llm: LLM) -> None:
    """Every request is gone: no block in use, all invariants hold."""
    engine = llm.llm_engine
    engine.check_integrity()
    metrics = llm.metrics()
    assert metrics["num_blocks_used"] == 0
    assert metrics["num_blocks_free"] + metrics["num_blocks_cached"] == metrics["num_blocks_total"]
    assert all(b["ref_count"] == 0 for b in metrics["block_map"])


@pytest.fixture(autouse=True)
def idle_engine_check():
    yield
    for llm in _engines.values():
        assert_idle(llm)


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
