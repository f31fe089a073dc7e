"""RoPE tables for every implemented rope_type equal transformers' own (`modeling_rope_utils`), and the types
whose HF tables depend on the running sequence length are refused by name."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inference.rope import inverse_frequencies, rope_parameters

HEAD_DIM, MAX_POSITIONS = 64, 4096
CASES = {
    "linear": {"factor": 4.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {"factor": 8.0, "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 0.5,
                    "beta_fast": 16, "beta_slow": 2},
    "yarn-untruncated": {"factor": 2.0, "original_max_position_embeddings": 1024, "truncate": False},
}


def config(rope: dict) -> LlamaConfig:
    return LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=HEAD_DIM,
                       max_position_embeddings=MAX_POSITIONS, rope_parameters={"rope_theta": 500000.0, **rope})


@pytest.mark.parametrize("case", sorted(CASES))
def test_inverse_frequencies_equal_transformers(case):
    rope = {"rope_type": case.split("-")[0], **CASES[case]}
    hf = config(rope)
    want, want_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
    got, scale = inverse_frequencies(rope_parameters(hf.to_dict(), "test"), HEAD_DIM, MAX_POSITIONS)
    assert torch.equal(got, want)
    assert scale == want_scale
    assert not torch.equal(got, inverse_frequencies(rope_parameters({}, "test") | {"rope_theta": 500000.0},
                                                    HEAD_DIM, MAX_POSITIONS)[0])  # the scaling did something


def test_old_rope_scaling_spelling_reads_the_same():
    old = {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **CASES["llama3"]}}
    new = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **CASES["llama3"]}}
    assert rope_parameters(old, "old") == rope_parameters(new, "new")


@pytest.mark.parametrize("config_json, named", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}, "'longrope'"),
    ({"rope_parameters": {"rope_type": "default"}, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}}, "beta_fast"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "high_freq_factor"),
])
def test_unimplemented_rope_is_refused_by_name(config_json, named):
    with pytest.raises(ValueError, match=named):
        rope_parameters(config_json, "config.json")
