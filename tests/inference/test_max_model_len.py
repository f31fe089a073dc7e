"""`max_model_len` left unset is what the model and the KV pool both allow (as vLLM derives it from the model);
a value set by the user is checked against both, and prompts past the resolved window are refused by name."""

import pytest

from inference.config import EngineArgs
from inference.engine import LLMEngine
from inference.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def loaded() -> LLMEngine:
    """SmolLM2 once (max_position_embeddings 8,192); the engines below share its weights, each its own pool."""
    engine = LLMEngine(EngineArgs(device="cpu", num_kv_blocks=16, max_model_len=256))
    yield engine
    engine.close()


def engine_with(loaded: LLMEngine, **kwargs) -> LLMEngine:
    return LLMEngine(EngineArgs(device="cpu", **kwargs), share_weights_with=loaded)


def test_unset_it_is_the_models_context_when_the_pool_holds_more(loaded):
    assert loaded.runner.cfg.max_position_embeddings == 8192
    engine = engine_with(loaded, num_kv_blocks=600, block_size=16)  # 9,600 tokens of pool
    assert engine.max_model_len == 8192 and engine.processor.max_model_len == 8192


def test_unset_it_is_the_pools_tokens_when_the_pool_holds_fewer(loaded):
    engine = engine_with(loaded, num_kv_blocks=20, block_size=16)
    assert engine.max_model_len == 320
    with pytest.raises(ValueError, match="max_model_len is 320"):
        engine.add_request("long", {"prompt_token_ids": [1] * 320}, SamplingParams(max_tokens=1))
    engine.add_request("fits", {"prompt_token_ids": [1] * 300}, SamplingParams(max_tokens=50, ignore_eos=True))
    while engine.has_unfinished_requests():
        outputs = engine.step()
    assert outputs[0].outputs[0].finish_reason == "length"
    assert len(outputs[0].outputs[0].token_ids) == 20  # capped at the window, not max_tokens
    engine.check_integrity()
    assert engine.block_manager.pool.num_used_blocks == 0  # every block back


def test_a_set_value_the_pool_cannot_hold_or_the_model_cannot_reach_is_refused(loaded):
    with pytest.raises(ValueError, match="less than one sequence of max_model_len=400"):
        engine_with(loaded, num_kv_blocks=20, block_size=16, max_model_len=400)
    with pytest.raises(ValueError, match="max_position_embeddings 8192"):
        engine_with(loaded, num_kv_blocks=600, max_model_len=9000)
    assert engine_with(loaded, num_kv_blocks=20, max_model_len=128).max_model_len == 128
