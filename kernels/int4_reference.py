"""Pure-torch reference for the weight-only int4 matmul: the semantics ``kernels.int4_triton`` must match.

Layout (one ``[N, K]`` weight, N output rows, K inputs, groups of ``group_size`` consecutive inputs):

- ``packed``  uint8 ``[N, K // 2]``: input ``2j`` in the low nibble of byte ``j``, input ``2j + 1`` in the high.
- ``scales_zeros``  ``[K // group_size, N, 2]`` in the activation dtype: ``[..., 0]`` the scale, ``[..., 1]``
  the zero, so that ``w[n, k] = (code[n, k] - 8) * scale[g, n] + zero[g, n]`` with ``g = k // group_size``.

The scale/zero convention is the one torch's CPU int4 kernel (``_weight_int4pack_mm_for_cpu``) uses, so
one set of scales serves both; only the code packing differs (torch's CPU packing is its own).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["pack_codes", "unpack_codes", "dequantize_int4", "int4_matmul"]


def pack_codes(codes: Tensor) -> Tensor:
    """``[N, K]`` integer codes in 0..15 -> uint8 ``[N, K // 2]`` (even input in the low nibble)."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_codes(packed: Tensor) -> Tensor:
    """uint8 ``[N, K // 2]`` -> uint8 ``[N, K]`` codes in 0..15."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def dequantize_int4(packed: Tensor, scales_zeros: Tensor, group_size: int, dtype: torch.dtype) -> Tensor:
    """The ``[N, K]`` weight in ``dtype``: ``code * scale + (zero - 8 * scale)`` per group, in ``dtype``.

    That is ``(code - 8) * scale + zero`` with the 8 folded into the per-group offset, so the full-size
    work is one nibble split and one fused multiply-add.
    """
    n, k = packed.shape[0], packed.shape[1] * 2
    codes = unpack_codes(packed).view(n, k // group_size, group_size).to(dtype)
    scale_zero = scales_zeros.transpose(0, 1).to(dtype)  # [N, K // G, 2]
    scale = scale_zero[..., :1].contiguous()
    offset = (scale_zero[..., 1:] - 8 * scale).contiguous()
    return torch.addcmul(offset, codes, scale).view(n, k)


def int4_matmul(x: Tensor, packed: Tensor, scales_zeros: Tensor, group_size: int) -> Tensor:
    """``x @ W.T`` for ``x: [M, K]``: de-quantise one layer's weight transiently, then one dense matmul."""
    return torch.nn.functional.linear(x, dequantize_int4(packed, scales_zeros, group_size, x.dtype))
