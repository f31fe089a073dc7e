"""gelu_tanh_and_mul, Gemma's GeGLU: every backend's op against transformers' own `gelu_pytorch_tanh` (the
activation Gemma's HF MLP applies to the gate before the product with up)."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from kernels import cpu_kernels, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_and_mul_equals_transformers(dtype):
    torch.manual_seed(0)
    x = (torch.randn(9, 2 * 96) * 4).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    want = ACT2FN["gelu_pytorch_tanh"](gate) * up
    for ops in (reference, cpu_kernels):
        got = ops.gelu_tanh_and_mul(x)
        assert got.dtype == dtype and torch.equal(got, want)
    assert not torch.equal(want, reference.silu_and_mul(x))  # a different activation from Llama's


def test_gelu_tanh_and_mul_refuses_an_odd_width():
    with pytest.raises(ValueError, match="gate then up"):
        reference.gelu_tanh_and_mul(torch.zeros(3, 7))
