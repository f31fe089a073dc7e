"""A config.json field the engine does not implement is refused at load with its name; the families' own
transformers configs (and the built-in model's) load, each with its Architecture."""

import json

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

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
    ({"layer_types": ["full_attention", "chunked_attention"]}, "chunked_attention"),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64}, "sliding_window=64"),
    ({"model_type": "gemma2"}, "'gemma2'"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}, "'longrope'"),
])
def test_unimplemented_field_is_refused_by_name(tmp_path, change, named):
    with pytest.raises(ValueError, match=named):
        load(tmp_path, {**LlamaConfig(**SHAPE).to_dict(), **change})


def test_a_window_a_sequence_can_cross_is_refused(tmp_path):
    # Mistral applies sliding_window to every layer; a window >= max_position_embeddings is never crossed.
    assert load(tmp_path, MistralConfig(**SHAPE, sliding_window=512).to_dict())
    with pytest.raises(ValueError, match="sliding_window=256"):
        load(tmp_path, MistralConfig(**SHAPE, sliding_window=256).to_dict())
    # Qwen's window applies only with use_sliding_window.
    assert load(tmp_path, {**Qwen2Config(**SHAPE).to_dict(), "sliding_window": 64, "layer_types": None})
    with pytest.raises(ValueError, match="sliding_window=64"):
        load(tmp_path, {**Qwen2Config(**SHAPE).to_dict(), "sliding_window": 64, "layer_types": None,
                        "use_sliding_window": True})
