"""RoPE tables for every implemented rope_type equal transformers' own (`modeling_rope_utils`), partial rotary
and LongRoPE's short and long tables included; `dynamic`, whose HF table follows the running sequence length,
is refused by name."""

import pytest
import torch
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from inference.model import RotaryEmbedding
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
    "yarn-partial": {"factor": 4.0, "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5},
}
ORIGINAL = 1024  # LongRoPE's original_max_position_embeddings in the Phi-3 cases


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
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0]}}, "long_factor"),
    ({"rope_parameters": {"rope_type": "default"}, "partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}}, "beta_fast"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "high_freq_factor"),
])
def test_unimplemented_rope_is_refused_by_name(config_json, named):
    with pytest.raises(ValueError, match=named):
        rope_parameters(config_json, "config.json")


@pytest.mark.parametrize("rope, head_dim, named", [
    ({"rope_type": "default", "partial_rotary_factor": 0.3}, 64, "rotates 19 dimensions"),  # odd
    ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3,
      "original_max_position_embeddings": 16}, 64, "need 32 entries"),
])
def test_tables_the_kernels_cannot_apply_are_refused(rope, head_dim, named):
    with pytest.raises(ValueError, match=named):
        inverse_frequencies(rope_parameters({"rope_parameters": rope}, "test"), head_dim, 512)


def phi3(partial: float = 0.75, longrope: bool = False, **rope) -> Phi3Config:
    """Phi-4-mini's RoPE shape: heads of 64, the first `partial` of each rotated; LongRoPE with `rope`'s keys."""
    pairs = int(HEAD_DIM * partial) // 2
    if longrope:
        rope = {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
                "long_factor": [2.0 + 3.0 * i for i in range(pairs)], **rope}
    return Phi3Config(hidden_size=4 * HEAD_DIM, num_attention_heads=4, max_position_embeddings=MAX_POSITIONS,
                      original_max_position_embeddings=ORIGINAL,
                      rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": partial, **rope})


def test_partial_rotary_tables_cover_the_rotated_dimensions_only():
    hf = phi3()
    want, want_scale = Phi3RotaryEmbedding.compute_default_rope_parameters(hf)
    got, scale = inverse_frequencies(rope_parameters(hf.to_dict(), "test"), HEAD_DIM, MAX_POSITIONS)
    assert got.shape == (24,) and torch.equal(got, want) and scale == want_scale


@pytest.mark.parametrize("extra", [{}, {"factor": 2.0}, {"attention_factor": 1.25}])
@pytest.mark.parametrize("max_model_len, side", [(ORIGINAL, "short"), (ORIGINAL + 1, "long"), (None, "long")])
def test_longrope_table_is_hfs_for_a_sequence_of_max_model_len(extra, max_model_len, side):
    """HF's table for a forward whose sequence is max_model_len long (max_position_embeddings when None): the
    short factors up to original_max_position_embeddings, the long ones past it; the attention factor from
    max_position_embeddings / original unless the checkpoint gives `factor` or `attention_factor`."""
    hf = phi3(longrope=True, **extra)
    params = rope_parameters(hf.to_dict(), "test")
    seq_len = MAX_POSITIONS if max_model_len is None else max_model_len
    want, want_scale = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq_len)
    got, scale = inverse_frequencies(params, HEAD_DIM, MAX_POSITIONS, max_model_len)
    assert torch.equal(got, want) and scale == want_scale
    other = "long" if side == "short" else "short"
    assert not torch.equal(got, ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=ORIGINAL + (other == "long"))[0])
    # The engine's table is HF's cos and sin at every position, scaled by the attention factor.
    rope = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, params, max_model_len)
    positions = torch.arange(0, MAX_POSITIONS, 97)
    freqs = positions[:, None].float() * want
    torch.testing.assert_close(rope.cos[positions], freqs.cos() * want_scale, rtol=0, atol=0)
    torch.testing.assert_close(rope.sin[positions], freqs.sin() * want_scale, rtol=0, atol=0)


def test_a_top_level_original_max_position_embeddings_wins_as_in_hf():
    config = phi3(longrope=True).to_dict()  # the rope dict says 64, the top level 1024
    config["rope_parameters"]["original_max_position_embeddings"] = 64
    assert rope_parameters(config, "test")["original_max_position_embeddings"] == ORIGINAL
