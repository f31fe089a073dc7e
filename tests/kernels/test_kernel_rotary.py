"""rotary_embedding_: the C++ one-pass op is bit-equal to the torch reference (which is the HF formula), in
place on a strided view of a fused qkv output, over whole heads or (partial rotary, Phi-4-mini's) their first
rotary_dim dimensions only, and refuses bad shapes. The Triton backend's rotary is the reference itself."""

from __future__ import annotations

import pytest
import torch

from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

from inference.model import RotaryEmbedding
from kernels import cpu_kernels, reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())


def qkv_and_tables(dtype: torch.dtype, tokens: int = 37, heads: int = 9, kv_heads: int = 3, head_dim: int = 64,
                   partial: float = 1.0):
    torch.manual_seed(0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    rope = RotaryEmbedding(head_dim, 4096, {"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": partial})
    cos, sin = rope.tables(torch.randint(0, 4096, (tokens,)), dtype)
    return qkv, cos, sin


def qk_view(qkv: torch.Tensor, heads: int = 9, kv_heads: int = 3, head_dim: int = 64) -> torch.Tensor:
    return qkv[:, : (heads + kv_heads) * head_dim].view(-1, heads + kv_heads, head_dim)


@pytest.mark.parametrize("partial", [1.0, 0.75, 0.25])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_rotary_is_bit_equal_to_the_reference_and_leaves_v_alone(dtype, partial):
    qkv, cos, sin = qkv_and_tables(dtype, partial=partial)
    ours, want = qkv.clone(), qkv.clone()
    cpu_kernels.rotary_embedding_(qk_view(ours), cos, sin)
    reference.rotary_embedding_(qk_view(want), cos, sin)
    assert torch.equal(ours, want)
    assert not torch.equal(ours, qkv)  # it did rotate
    v = slice((9 + 3) * 64, None)
    assert torch.equal(ours[:, v], qkv[:, v])
    rotated = int(64 * partial)  # each q and k head keeps its dimensions past rotary_dim
    assert torch.equal(qk_view(ours)[..., rotated:], qk_view(qkv)[..., rotated:])


def test_reference_is_the_hf_formula():
    qkv, cos, sin = qkv_and_tables(torch.float32, tokens=5)
    x = qk_view(qkv.clone())
    full_cos, full_sin = torch.cat([cos, cos], -1).unsqueeze(1), torch.cat([sin, sin], -1).unsqueeze(1)
    rotate_half = torch.cat([-x[..., 32:], x[..., :32]], -1)
    want = x * full_cos + rotate_half * full_sin
    reference.rotary_embedding_(x, cos, sin)
    torch.testing.assert_close(x, want)


def test_partial_reference_is_hfs_partial_rotary():
    """transformers' Phi-3 apply_rotary_pos_emb: rotate-half over the first rotary_dim dimensions, the rest
    passed through."""
    qkv, cos, sin = qkv_and_tables(torch.float32, tokens=5, partial=0.75)
    x = qk_view(qkv.clone())
    full_cos, full_sin = torch.cat([cos, cos], -1).unsqueeze(0), torch.cat([sin, sin], -1).unsqueeze(0)
    heads = x.transpose(0, 1).unsqueeze(0)  # HF's [batch, heads, tokens, head_dim]
    want, _ = apply_rotary_pos_emb(heads, heads, full_cos, full_sin)
    reference.rotary_embedding_(x, cos, sin)
    torch.testing.assert_close(x, want[0].transpose(0, 1))


@pytest.mark.parametrize("rotary", [reference.rotary_embedding_, cpu_kernels.rotary_embedding_])
def test_bad_shapes_are_refused(rotary):
    qkv, cos, sin = qkv_and_tables(torch.float32)
    with pytest.raises(ValueError, match="cos must be"):
        rotary(qk_view(qkv), cos[:-1], sin)
    with pytest.raises(ValueError, match="sin must be"):
        rotary(qk_view(qkv), cos, sin.double())
    with pytest.raises(ValueError, match="even, contiguous head_dim"):
        rotary(torch.zeros(4, 2, 7), cos[:4, :3], sin[:4, :3])
    with pytest.raises(ValueError, match="at most head_dim / 2"):  # more angles than a head has pairs
        rotary(qk_view(qkv)[:, :, :32], cos, sin)
