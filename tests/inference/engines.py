"""The engine tests' shared engines: one registry, and the check that they are idle.

Loading a model takes seconds, so engines are built once per configuration and shared by every test.
Tests import these helpers from here, never from a conftest: a conftest imported by name becomes a second
module beside the one pytest loaded, with its own registry, and the idle check would walk an empty copy.
"""

from __future__ import annotations

from inference import LLM

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
