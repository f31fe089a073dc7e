"""The engine tests' shared engines (one registry) and their prompts.

Loading a model takes seconds, so engines are built once per configuration and shared by every test.
Tests import these helpers from here, never from a conftest: a conftest imported by name becomes a second
module beside the one pytest loaded, with its own registry, and the idle check would walk an empty copy.
"""

from __future__ import annotations

from inference import LLM

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
    """An engine for this configuration, built on first use (small KV pools keep memory modest)."""
    kwargs.setdefault("num_kv_blocks", 256)
    key = tuple(sorted(kwargs.items()))
    if key not in _engines:
        _engines[key] = LLM(**kwargs)
    return _engines[key]


def assert_idle(llm: LLM) -> None:
    """Every request is gone: none left in the engine, no block in use, all invariants hold."""
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests(), f"requests left in the engine: {sorted(engine.requests)}"
    engine.check_integrity()
    metrics = llm.metrics()
    assert metrics["num_blocks_used"] == 0
    assert metrics["num_blocks_free"] + metrics["num_blocks_cached"] == metrics["num_blocks_total"]
    assert all(b["ref_count"] == 0 for b in metrics["block_map"])


def assert_all_idle() -> None:
    """`assert_idle` for every engine built so far."""
    for llm in _engines.values():
        assert_idle(llm)
