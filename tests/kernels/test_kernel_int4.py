"""Weight-only int4 matmul: Triton (interpreted on CPU) vs the torch reference vs a float64 dense matmul."""

from __future__ import annotations

import pytest
import torch

from kernels import int4_reference


def random_layer(n: int, k: int, group: int, dtype: torch.dtype, device: torch.device):
    gen = torch.Generator().manual_seed(n * 1000 + k + group)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    scales = torch.rand(k // group, n, generator=gen) * 0.02 + 0.001
    zeros = torch.randn(k // group, n, generator=gen) * 0.01
    scales_zeros = torch.stack([scales, zeros], dim=-1).to(dtype)
    return codes, int4_reference.pack_codes(codes).to(device), scales_zeros.to(device)


def test_pack_and_unpack_are_inverse_and_dequantize_follows_the_formula():
    codes, packed, sz = random_layer(8, 64, 32, torch.float32, torch.device("cpu"))
    assert torch.equal(int4_reference.unpack_codes(packed).long(), codes)
    w = int4_reference.dequantize_int4(packed, sz, 32, torch.float32)
    g = torch.arange(64) // 32
    want = (codes - 8) * sz[g, :, 0].t() + sz[g, :, 1].t()
    torch.testing.assert_close(w, want.float(), rtol=0, atol=1e-7)


@pytest.mark.parametrize("m,n,k,group,dtype", [
    (1, 96, 128, 32, torch.float32), (5, 64, 192, 64, torch.float32), (33, 80, 64, 32, torch.bfloat16)])
def test_triton_matches_reference_and_dense(m, n, k, group, dtype, device):
    from kernels import int4_triton

    if device.type == "cpu" and not int4_triton.INTERPRETED:
        pytest.fail("kernels.int4_triton was imported before TRITON_INTERPRET=1 was set")
    codes, packed, sz = random_layer(n, k, group, dtype, device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(device)
    dense = x.double() @ int4_reference.dequantize_int4(packed, sz, group, torch.float64).t()
    ref = int4_reference.int4_matmul(x, packed, sz, group)
    out = int4_triton.int4_matmul(x, packed, sz, group)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out.double(), dense, rtol=tol, atol=tol)
    torch.testing.assert_close(ref.double(), dense, rtol=tol, atol=tol)


def test_triton_rejects_mismatched_shapes(device):
    from kernels import int4_triton

    _, packed, sz = random_layer(64, 64, 32, torch.float32, device)
    with pytest.raises(ValueError, match="do not fit"):
        int4_triton.int4_matmul(torch.zeros(2, 128, device=device), packed, sz, 32)
