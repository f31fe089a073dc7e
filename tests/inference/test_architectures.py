"""A config.json field the engine does not implement is refused at load with its name; the families' own
transformers configs (and the built-in model's) load, each with its Architecture."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, MistralConfig, MixtralConfig, Olmo2Config, Phi3Config, Qwen2Config,
                          Qwen3Config, Qwen3MoeConfig, SmolLM3Config)

from inference.architectures import ARCHITECTURES
from inference.config import EngineArgs
from inference.model import ModelConfig
from inference.model_loader import DEFAULT_MODEL, resolve_model
from inference.parallel.ranks import check_tensor_parallel
from inference.quantization import QuantizationConfig
from inference.weight_files import read_weights
from tests.inference.tiny_models import SHAPE

# The new families' configs with ids inside SHAPE's vocabulary (their defaults name their own tokenizers').
IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def load(tmp_path, config: dict) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelConfig.from_folder(tmp_path)


@pytest.mark.parametrize("config_cls", [LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Olmo2Config,
                                        SmolLM3Config, Phi3Config])
def test_families_own_configs_load(tmp_path, config_cls):
    cfg = load(tmp_path, config_cls(**SHAPE, **IDS).to_dict())
    assert cfg.architecture == ARCHITECTURES[config_cls.model_type]
    assert cfg.architecture.qk_norm == {Qwen3Config: "head", Olmo2Config: "projection"}.get(config_cls)
    assert cfg.architecture.llama_block == (config_cls not in (Qwen3Config, Olmo2Config))
    assert cfg.attention_bias == (config_cls is Qwen2Config)
    assert cfg.nope_layers == ()  # SmolLM3's default interval of 4 leaves 2 layers with RoPE


def test_smollm3_nope_layers_read_as_transformers_reads_them(tmp_path):
    config = SmolLM3Config(**{**SHAPE, "num_hidden_layers": 8}, **IDS).to_dict()
    assert load(tmp_path, config).nope_layers == (3, 7)  # every 4th layer
    assert load(tmp_path, {**config, "no_rope_layers": [1, 0] * 4}).nope_layers == (1, 3, 5, 7)
    del config["no_rope_layers"]
    assert load(tmp_path, {**config, "no_rope_layer_interval": 2}).nope_layers == (1, 3, 5, 7)
    with pytest.raises(ValueError, match="no_rope_layers must hold one 0 or 1 per layer"):
        load(tmp_path, {**config, "no_rope_layers": [1, 0]})


def test_olmo2_under_tensor_parallelism_is_refused(tmp_path):
    cfg = load(tmp_path, Olmo2Config(**SHAPE, **IDS).to_dict())
    with pytest.raises(ValueError, match="q/k norm over the whole projection"):
        check_tensor_parallel(EngineArgs(model=str(tmp_path), tensor_parallel_size=2), cfg, torch.device("cpu"),
                              None)


def test_phi3_fused_weights_split_into_llama_names_and_awq_is_refused(tmp_path):
    qkv, gate_up = torch.randn(4 * 16 + 2 * 2 * 16, 64), torch.randn(2 * 128, 64)
    save_file({"model.layers.0.self_attn.qkv_proj.weight": qkv, "model.layers.0.mlp.gate_up_proj.weight": gate_up},
              str(tmp_path / "model.safetensors"))
    fused = ARCHITECTURES["phi3"].fused_weights
    weights = read_weights(tmp_path, None, 1, 64, 4, 2, None, fused)
    assert sorted(weights) == [f"layers.0.{m}.weight" for m in ("mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj",
                                                               "self_attn.q_proj", "self_attn.v_proj")]
    assert torch.equal(torch.cat([weights[f"layers.0.self_attn.{x}_proj.weight"] for x in "qkv"]), qkv)
    assert torch.equal(weights["layers.0.mlp.gate_proj.weight"], gate_up[:128])
    with pytest.raises(ValueError, match="AWQ checkpoint of a model with fused qkv_proj / gate_up_proj"):
        read_weights(tmp_path, QuantizationConfig("awq"), 1, 64, 4, 2, None, fused)


def test_builtin_model_config_loads():
    cfg = ModelConfig.from_folder(resolve_model(DEFAULT_MODEL))
    assert cfg.rope == {"rope_type": "default", "rope_theta": 100000.0}


@pytest.mark.parametrize("change, named", [
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    # Llama has no windows: HF's Llama reads neither field.
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"sliding_window": 64}, "sliding_window"),
    ({"model_type": "gemma2"}, "'gemma2'"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers"),  # SmolLM3's alone
    ({"original_max_position_embeddings": 64}, "original_max_position_embeddings"),  # Phi-3's alone
])
def test_unimplemented_field_is_refused_by_name(tmp_path, change, named):
    with pytest.raises(ValueError, match=named):
        load(tmp_path, {**LlamaConfig(**SHAPE).to_dict(), **change})


def qwen2(**change) -> dict:
    return {**Qwen2Config(**SHAPE).to_dict(), "layer_types": None, **change}


@pytest.mark.parametrize("config, windows", [
    # Mistral windows every layer; a window >= max_position_embeddings is never crossed: full attention.
    (MistralConfig(**SHAPE, sliding_window=256).to_dict(), [256, 256]),
    (MistralConfig(**SHAPE, sliding_window=512).to_dict(), [None, None]),
    (MistralConfig(**SHAPE, sliding_window=None).to_dict(), [None, None]),
    # Qwen's window applies only with use_sliding_window, from layer max_window_layers on ...
    (qwen2(sliding_window=64), [None, None]),
    (qwen2(sliding_window=64, use_sliding_window=True, max_window_layers=1), [None, 64]),
    (qwen2(sliding_window=64, use_sliding_window=True, max_window_layers=0), [64, 64]),
    # ... or where layer_types says so (HF writes it from max_window_layers; Gemma-style alternation).
    (Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=64, max_window_layers=1).to_dict(), [None, 64]),
    (qwen2(sliding_window=64, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"]),
     [64, None]),
    (qwen2(sliding_window=64, layer_types=["sliding_attention", "full_attention"]), [None, None]),
    (Qwen3Config(**SHAPE, use_sliding_window=True, sliding_window=64, max_window_layers=1).to_dict(), [None, 64]),
    # HF's Mixtral and Qwen3-MoE window every layer (the latter under use_sliding_window).
    (MixtralConfig(**SHAPE, sliding_window=64).to_dict(), [64, 64]),
    (Qwen3MoeConfig(**SHAPE, use_sliding_window=True, sliding_window=64).to_dict(), [64, 64]),
    # SmolLM3 windows its NoPE layers (HF writes layer_types so), under use_sliding_window; Phi-3 every layer.
    (SmolLM3Config(**SHAPE, **IDS, use_sliding_window=True, sliding_window=64, no_rope_layer_interval=2).to_dict(),
     [None, 64]),
    (SmolLM3Config(**SHAPE, **IDS, sliding_window=64, no_rope_layer_interval=2).to_dict(), [None, None]),
    (Phi3Config(**SHAPE, **IDS, sliding_window=64).to_dict(), [64, 64]),
])
def test_each_layers_window_is_read_as_hf_reads_it(tmp_path, config, windows):
    assert load(tmp_path, config).windows == windows


@pytest.mark.parametrize("config, named", [
    (qwen2(sliding_window=64, use_sliding_window=True, layer_types=["full_attention", "chunked_attention"]),
     "chunked_attention"),
    (qwen2(sliding_window=64, use_sliding_window=True, layer_types=["full_attention"]), "layer_types"),
    (qwen2(sliding_window=64, use_sliding_window=True, max_window_layers=None), "max_window_layers"),
    (qwen2(sliding_window=0, use_sliding_window=True), "sliding_window"),
    # HF's Mistral ignores layer_types (Ministral reads it): refused rather than read either way.
    ({**MistralConfig(**SHAPE, sliding_window=64).to_dict(), "layer_types": ["sliding_attention"] * 2},
     "layer_types"),
    # SmolLM3 without layer_types would window its NoPE layers (HF derives them): refused, not guessed.
    ({**SmolLM3Config(**SHAPE, **IDS, use_sliding_window=True, sliding_window=64).to_dict(), "layer_types": None},
     "use_sliding_window without layer_types"),
    # OLMo 2's HF model has no window.
    ({**Olmo2Config(**SHAPE, **IDS).to_dict(), "sliding_window": 64}, "sliding_window"),
])
def test_a_window_setting_the_engine_cannot_state_is_refused_by_name(tmp_path, config, named):
    with pytest.raises(ValueError, match=named):
        load(tmp_path, config)
