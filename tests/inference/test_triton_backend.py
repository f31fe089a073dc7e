"""The engine with Triton attention (interpreted on the CPU) produces the torch backend's greedy tokens."""

import pytest

from inference import SamplingParams
from tests.inference.engines import get_llm

pytest.importorskip("triton")


@pytest.mark.slow
def test_triton_backend_matches_torch_backend():
    prompts = ["The capital of France is", "1, 2, 3,"]
    params = SamplingParams(temperature=0, max_tokens=6)
    torch_out = get_llm(attention_backend="torch").generate(prompts, params)
    triton_llm = get_llm(attention_backend="triton", num_kv_blocks=64, max_model_len=256)
    assert triton_llm.llm_engine.runner.ops.__name__ == "kernels.triton_kernels"
    triton_out = triton_llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in triton_out] == [o.outputs[0].token_ids for o in torch_out]
