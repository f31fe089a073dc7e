"""silu_and_mul: the C++ one-pass activation against the torch reference (`F.silu(gate) * up`); its exp is a
polynomial rather than torch's, so results agree to a rounding step of the dtype."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_kernels, reference

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=cpu_kernels.unavailable_reason())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_silu_and_mul_equals_the_reference_to_rounding(dtype):
    torch.manual_seed(0)
    x = (torch.randn(37, 2 * 1541) * 4).to(dtype)  # an odd width: the scalar tail after 16-wide blocks
    x[0, :6] = torch.tensor([0.0, -0.0, 90.0, -90.0, 1e-30, -1e-30])  # exp's clamped ends, tiny values
    ours, want = cpu_kernels.silu_and_mul(x), reference.silu_and_mul(x)
    assert ours.shape == (37, 1541) and ours.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(ours, want, rtol=1e-6, atol=1e-7)
    else:
        step = torch.finfo(dtype).eps * want.float().abs().clamp(min=1e-3)
        assert ((ours.float() - want.float()).abs() <= 2 * step).all()
        assert (ours == want).float().mean() > 0.99


def test_cpu_silu_and_mul_reads_a_strided_view_and_refuses_an_odd_width():
    x = torch.randn(5, 3 * 64)[:, :128]
    torch.testing.assert_close(cpu_kernels.silu_and_mul(x), reference.silu_and_mul(x))
    with pytest.raises(ValueError, match="gate then up"):
        cpu_kernels.silu_and_mul(torch.zeros(3, 7))
