"""rms_norm: the C++ one-pass op against the torch reference (HF's formula); only the sum of squares is
ordered differently, so results agree to a rounding step of the dtype."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_kernels, reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_rms_norm_equals_the_reference_to_rounding(dtype):
    torch.manual_seed(0)
    x = (torch.randn(70, 576) * 3).to(dtype)
    weight = torch.randn(576).to(dtype)
    ours, want = cpu_kernels.rms_norm(x, weight, 1e-5), reference.rms_norm(x, weight, 1e-5)
    assert ours.shape == want.shape and ours.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(ours, want, rtol=2e-6, atol=1e-6)
    else:  # one step of the dtype at most, where the float32 scale rounded the other way
        step = torch.finfo(dtype).eps * want.float().abs().clamp(min=1e-3)
        assert ((ours.float() - want.float()).abs() <= 2 * step).all()
        assert (ours == want).float().mean() > 0.99


def test_cpu_rms_norm_reads_a_strided_view_and_refuses_a_wrong_weight():
    x = torch.randn(8, 2 * 64)[:, :64]  # rows 128 apart
    weight = torch.rand(64)
    torch.testing.assert_close(cpu_kernels.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6))
    with pytest.raises(ValueError, match="weight must be"):
        cpu_kernels.rms_norm(x, weight[:-1], 1e-6)


def test_gemma_unit_offset_norm_folded_into_the_weight_is_bit_equal_to_hf_in_float32():
    """Gemma's RMSNorm multiplies the float32-normalised row by (1 + w) in float32; the loader folds 1 + w into
    the weight (inference/model.py), which the reference's norm then multiplies by: the same product, bit for bit."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    torch.manual_seed(0)
    x, w = torch.randn(70, 576) * 3, torch.randn(576) * 0.2
    hf = Gemma2RMSNorm(576, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(w)
        want = hf(x)
    assert torch.equal(reference.rms_norm(x, 1.0 + w, 1e-6), want)
    torch.testing.assert_close(cpu_kernels.rms_norm(x, 1.0 + w, 1e-6), want, rtol=2e-6, atol=1e-6)
