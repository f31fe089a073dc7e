"""Latent attention (inference/mla.py): the cache holds one latent + RoPE key per token and layer, in one tensor
that serves as both key and value cache; DeepSeek's adjacent-pair RoPE equals our halves RoPE after the loader's
row reordering; what latent attention does not support is refused by name. The whole-model oracle (greedy equals
HF generate with prefix caching, chunked prefill and preemption) is test_model_families.py[deepseek-*]."""

import json

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

from inference import LLM
from inference.mla import deinterleave_rope_rows
from inference.model import ModelConfig
from kernels import reference
from tests.inference.test_model_families import DEEPSEEK
from tests.inference.tiny_models import SHAPE, save_tiny

SMALL = dict(num_kv_blocks=32, max_model_len=128)


@pytest.fixture(scope="module")
def tiny_deepseek(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepseek-v2")
    save_tiny(folder, DeepseekV2ForCausalLM, DeepseekV2Config(**DEEPSEEK))
    return folder


def test_adjacent_pair_rope_equals_halves_rope_on_reordered_rows():
    """DeepSeek rotates (x0, x1), (x2, x3), ...; reordering the rows that produce x to even-then-odd makes our
    rotate-half kernel compute the same rotated values, in the reordered positions."""
    torch.manual_seed(0)
    dim, tokens = 16, 5
    weight = torch.randn(dim, 8)
    x = torch.randn(tokens, 8)
    angles = torch.rand(tokens, dim // 2) * 6
    pairs = torch.view_as_complex((x @ weight.T).reshape(tokens, dim // 2, 2))
    theirs = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(1)
    ours = (x @ deinterleave_rope_rows(weight, dim, dim).T).unsqueeze(1).contiguous()
    reference.rotary_embedding_(ours, angles.cos(), angles.sin())
    order = torch.cat([torch.arange(0, dim, 2), torch.arange(1, dim, 2)])
    assert torch.allclose(ours[:, 0], theirs[:, order], atol=1e-5)


def test_the_cache_holds_one_latent_per_token_in_one_tensor(tiny_deepseek, tmp_path):
    with LLM(model=str(tiny_deepseek), dtype="float32", **SMALL) as llm:
        runner = llm.llm_engine.runner
        key, value = runner.kv_caches[0]
        assert key is value and key.shape == (32, 16, 1, 48 + 16)  # blocks, slots, one "head", latent + RoPE key
        per_token = 2 * 4 * (48 + 16)  # layers x (kv_lora_rank + qk_rope_head_dim) x float32 bytes
        assert llm.metrics()["kv_bytes_per_token"] == per_token
        assert llm.metrics()["kv_pool_bytes"] == 32 * 16 * per_token
    # The same attention as multi-head attention (4 KV heads of 48 for keys, values of 32) would take
    # 2 x 4 x 4 x 48 x 4 bytes: the latent cache is a sixth of it.
    llama = tmp_path / "llama"
    save_tiny(llama, LlamaForCausalLM, LlamaConfig(**{**SHAPE, "num_key_value_heads": 4, "head_dim": 48}))
    with LLM(model=str(llama), dtype="float32", **SMALL) as mha:
        assert mha.metrics()["kv_bytes_per_token"] == 2 * 2 * 4 * 48 * 4 == 6 * per_token


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int8"), "quantization='int8' of latent attention is not implemented"),
    (dict(enable_lora=True), "enable_lora does not support"),
    (dict(tensor_parallel_size=2), "tensor_parallel_size>1 does not support latent attention"),
], ids=["quantized", "lora", "tp"])
def test_what_latent_attention_does_not_support_is_refused_by_name(tiny_deepseek, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=str(tiny_deepseek), **SMALL, **kwargs)


def test_latent_fields_in_a_family_without_them_are_refused(tmp_path, tiny_deepseek):
    config = json.loads((tiny_deepseek / "config.json").read_text())
    llama = {k: v for k, v in config.items() if not k.startswith(("n_", "num_experts", "moe_", "first_k", "routed",
                                                                   "topk", "norm_topk"))}
    llama["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(llama))
    with pytest.raises(ValueError, match="kv_lora_rank, q_lora_rank, qk_head_dim, qk_nope_head_dim, qk_rope_head_dim, "
                                         "v_head_dim: latent attention is not part of a 'llama' model"):
        ModelConfig.from_folder(tmp_path)


def test_beam_search_and_copy_on_write_read_the_latent_cache_as_hf_does(tiny_deepseek):
    """Beams fork block tables and copy a shared partial block before writing it (copy-on-write): with the
    latent cache that is one tensor per layer, and the beams still equal HF transformers' own beam search."""
    from transformers import AutoModelForCausalLM

    from inference import BeamSearchParams
    from tests.inference.test_beam_search import hf_beams

    hf = AutoModelForCausalLM.from_pretrained(tiny_deepseek, dtype=torch.float32).eval()
    prompt = list(range(1000, 1021))  # a full block and 5 tokens: the beams share the partial block at first
    with LLM(model=str(tiny_deepseek), dtype="float32", **SMALL) as llm:
        params = BeamSearchParams(beam_width=3, max_tokens=12)
        (out,) = llm.beam_search([{"prompt_token_ids": prompt}], params)
        assert llm.metrics()["cow_copies_total"] > 0
        assert [c.token_ids for c in out.outputs] == hf_beams(hf, prompt, 3, 12, 1.0, False)
