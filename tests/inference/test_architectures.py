"""A config.json field the engine does not implement is refused at load with its name; the families' own
transformers configs (and the built-in model's) load, each with its Architecture."""

import json

import pytest
from transformers import LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from inference.architectures import ARCHITECTURES
from inference.model import ModelConfig
from inference.model_loader import DEFAULT_MODEL, resolve_model
from tests.inference.tiny_models import SHAPE


def load(tmp_path, config: dict) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ModelConfig.from_folder(tmp_path)


@pytest.mark.parametrize("config_cls", [LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config])
def test_families_own_configs_load(tmp_path, config_cls):
    cfg = load(tmp_path, config_cls(**SHAPE).to_dict())
    assert cfg.architecture == ARCHITECTURES[config_cls.model_type]
    assert cfg.architecture.qk_norm == (config_cls is Qwen3Config)
    assert cfg.attention_bias == (config_cls is Qwen2Config)


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
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}, "'longrope'"),
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
])
def test_a_window_setting_the_engine_cannot_state_is_refused_by_name(tmp_path, config, named):
    with pytest.raises(ValueError, match=named):
        load(tmp_path, config)
