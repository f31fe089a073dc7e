"""rotary_embedding_: the C++ one-pass op is bit-equal to the torch reference (which is the HF formula), in
place on a strided view of a fused qkv output, and refuses bad shapes."""

from __future__ import annotations

import pytest
import torch

from inference.model import RotaryEmbedding
from kernels import cpu_kernels, reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())


def qkv_and_tables(dtype: torch.dtype, tokens: int = 37, heads: int = 9, kv_heads: int = 3, head_dim: int = 64):
    torch.manual_seed(0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    rope = RotaryEmbedding(head_dim, 4096, {"rope_type": "default", "rope_theta": 10000.0})
    cos, sin = rope.tables(torch.randint(0, 4096, (tokens,)), dtype)
    return qkv, cos, sin


def qk_view(qkv: torch.Tensor, heads: int = 9, kv_heads: int = 3, head_dim: int = 64) -> torch.Tensor:
    return qkv[:, : (heads + kv_heads) * head_dim].view(-1, heads + kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_rotary_is_bit_equal_to_the_reference_and_leaves_v_alone(dtype):
    qkv, cos, sin = qkv_and_tables(dtype)
    ours, want = qkv.clone(), qkv.clone()
    cpu_kernels.rotary_embedding_(qk_view(ours), cos, sin)
    reference.rotary_embedding_(qk_view(want), cos, sin)
    assert torch.equal(ours, want)
    assert not torch.equal(ours, qkv)  # it did rotate
    v = slice((9 + 3) * 64, None)
    assert torch.equal(ours[:, v], qkv[:, v])


def test_reference_is_the_hf_formula():
    qkv, cos, sin = qkv_and_tables(torch.float32, tokens=5)
    x = qk_view(qkv.clone())
    full_cos, full_sin = torch.cat([cos, cos], -1).unsqueeze(1), torch.cat([sin, sin], -1).unsqueeze(1)
    rotate_half = torch.cat([-x[..., 32:], x[..., :32]], -1)
    want = x * full_cos + rotate_half * full_sin
    reference.rotary_embedding_(x, cos, sin)
    torch.testing.assert_close(x, want)


@pytest.mark.parametrize("rotary", [reference.rotary_embedding_, cpu_kernels.rotary_embedding_])
def test_bad_shapes_are_refused(rotary):
    qkv, cos, sin = qkv_and_tables(torch.float32)
    with pytest.raises(ValueError, match="cos must be"):
        rotary(qk_view(qkv), cos[:-1], sin)
    with pytest.raises(ValueError, match="sin must be"):
        rotary(qk_view(qkv), cos, sin.double())
    with pytest.raises(ValueError, match="even, contiguous head_dim"):
        rotary(torch.zeros(4, 2, 7), cos[:4, :3], sin[:4, :3])
