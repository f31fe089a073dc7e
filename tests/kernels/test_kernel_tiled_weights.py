"""The tiled int4 / int8 weights (CPUs with AMX): layouts against the plain weights, both kernels (GEMV for a few
tokens, AMX GEMM for more) against float64 matmuls of the values the layout stands for."""

from __future__ import annotations

import pytest
import torch

from inference.quantization.weights import quantize_int4
from kernels import int4_reference, tiled_weights

needs_amx = pytest.mark.skipif(not tiled_weights.available(), reason="no AMX / AVX-512 BF16 on this CPU")


def layer(n: int, k: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n + k + group)
    codes = quantize_int4(torch.randn(n, k, generator=gen) * 0.05, group)
    packed, scales_offsets = tiled_weights.pack_int4(codes.codes, codes.scales, codes.zeros)
    return codes, packed, scales_offsets


@pytest.mark.parametrize("group", [32, 64])
def test_int4_layout_stands_for_the_reference_values(group):
    codes, packed, so = layer(64, 128, group)
    # The reference's bfloat16 de-quantization (same scales, offsets rounded the same way) is the tiled values,
    # rounded: the AMX path multiplies by exactly these.
    sz = torch.stack([codes.scales.t(), codes.zeros.t()], dim=-1).to(torch.bfloat16)
    ref = int4_reference.dequantize_int4(int4_reference.pack_codes(codes.codes), sz, group, torch.bfloat16)
    assert torch.equal(tiled_weights.int4_values(packed, so, group).bfloat16(), ref)
    # And within bfloat16 rounding of the float32 weights the codes came from.
    torch.testing.assert_close(tiled_weights.int4_values(packed, so, group), codes.dequantize(), rtol=1e-2, atol=1e-3)


def test_int8_layout_round_trips_and_looks_rows_up():
    codes = torch.randint(-127, 128, (96, 64), dtype=torch.int8)
    tiles = tiled_weights.pack_int8(codes)
    assert torch.equal(tiled_weights.unpack_int8(tiles), codes)
    ids = torch.tensor([0, 17, 95, 17])
    assert torch.equal(tiled_weights.int8_rows(tiles, ids), codes[ids])


@needs_amx
@pytest.mark.parametrize("tokens", [1, 3, 8, 9, 33])
@pytest.mark.parametrize("group", [32, 64])
def test_int4_matmul_matches_float64(tokens, group):
    _, packed, so = layer(96, 192, group)
    x = torch.randn(tokens, 192).bfloat16()
    want = x.double() @ tiled_weights.int4_values(packed, so, group).double().T
    got = tiled_weights.int4_matmul(x, packed, so, group).double()
    # Up to 8 tokens the GEMV quantizes each 32 inputs of x to int8 (error <= half a step of absmax / 127 per
    # input); past it AMX multiplies bfloat16 weights. Both end in one bfloat16 rounding.
    tolerance = 0.02 if tokens <= 8 else 0.01
    assert ((got - want).abs().max() / want.abs().max()) < tolerance
    assert got.shape == (tokens, 96)


@needs_amx
@pytest.mark.parametrize("tokens", [1, 2, 8, 40])
def test_int8_matmul_matches_float64(tokens):
    codes = torch.randint(-127, 128, (64, 96), dtype=torch.int8)
    scales = (torch.rand(64) * 0.01 + 0.001).bfloat16()
    x = torch.randn(tokens, 96).bfloat16()
    want = x.double() @ (codes.double() * scales.double()[:, None]).T
    got = tiled_weights.int8_matmul(x, tiled_weights.pack_int8(codes), scales).double()
    assert ((got - want).abs().max() / want.abs().max()) < (0.02 if tokens <= 8 else 0.01)  # GEMV: int8 inputs


@needs_amx
def test_matmul_refuses_other_dtypes_and_widths():
    _, packed, so = layer(32, 64, 32)
    with pytest.raises(ValueError, match="bfloat16"):
        tiled_weights.int4_matmul(torch.randn(2, 64), packed, so, 32)
    with pytest.raises(ValueError, match=r"\[M, 64\]"):
        tiled_weights.int4_matmul(torch.randn(2, 32).bfloat16(), packed, so, 32)
