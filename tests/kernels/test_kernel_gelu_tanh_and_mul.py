"""gelu_tanh_and_mul, Gemma's GeGLU: the torch reference against transformers' own `gelu_pytorch_tanh` (the
activation Gemma's HF MLP applies to the gate before the product with up), and the C++ one-pass op against the
reference. The C++ op computes 0.5 g (1 + tanh(y)) as g / (1 + exp(-2y)), with its polynomial exp: it agrees with
torch's to a rounding step of the dtype, except in the far negative tail (gate below about -3), where torch's
1 + tanh(y) cancels to 0 or a few float32 steps and the C++ op keeps the tiny true value (absolute differences
below 1e-5 there)."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN

from kernels import cpu_kernels, reference


def gate_up(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = (torch.randn(37, 2 * 1541) * 4).to(dtype)  # an odd width: the scalar tail after the vector blocks
    x[0, :6] = torch.tensor([0.0, -0.0, 90.0, -90.0, 1e-30, -1e-30])  # exp's clamped ends, tiny values
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_transformers(dtype):
    x = gate_up(dtype)
    gate, up = x.chunk(2, dim=-1)
    want = ACT2FN["gelu_pytorch_tanh"](gate) * up
    got = reference.gelu_tanh_and_mul(x)
    assert got.dtype == dtype and torch.equal(got, want)
    assert not torch.equal(want, reference.silu_and_mul(x))  # a different activation from Llama's


@pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_gelu_tanh_and_mul_equals_the_reference_to_rounding(dtype):
    x = gate_up(dtype)
    ours, want = cpu_kernels.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x)
    assert ours.shape == (37, 1541) and ours.dtype == dtype
    tail = x.chunk(2, dim=-1)[0].float() < -3  # torch's cancellation: see the module's docstring
    diff = (ours.float() - want.float()).abs()
    assert diff[tail].max() < 1e-5
    if dtype == torch.float32:
        torch.testing.assert_close(ours[~tail], want[~tail], rtol=2e-6, atol=1e-6)  # cancellation again, less
    else:
        step = torch.finfo(dtype).eps * want.float().abs().clamp(min=1e-3)
        assert (diff[~tail] <= 2 * step[~tail]).all()
        assert (ours == want)[~tail].float().mean() > 0.99


@pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())
def test_cpu_gelu_tanh_and_mul_reads_a_strided_view():
    x = torch.randn(5, 3 * 64)[:, :128]
    torch.testing.assert_close(cpu_kernels.gelu_tanh_and_mul(x), reference.gelu_tanh_and_mul(x))


@pytest.mark.parametrize("ops", [reference, cpu_kernels])
def test_gelu_tanh_and_mul_refuses_an_odd_width(ops):
    with pytest.raises(ValueError, match="gate then up"):
        ops.gelu_tanh_and_mul(torch.zeros(3, 7))
