"""Triton weight-only int4 matmul (dequant-GEMM) for CUDA; semantics and layout: ``kernels.int4_reference``.

Each program computes a ``[BLOCK_M, BLOCK_N]`` tile of ``x @ W.T``. It walks K in steps of ``BLOCK_K``
(a multiple of 2 that divides the group size, so one step sits in one group): loads the packed bytes,
splits their nibbles, applies the step's scale and zero, and accumulates ``tl.dot`` in float32. The
weight is never materialised beyond one tile. Set ``TRITON_INTERPRET=1`` before importing to run it on CPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["int4_matmul", "INTERPRETED"]

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _int4_matmul_kernel(x_ptr, w_ptr, sz_ptr, out_ptr, M, N, K, stride_xm, stride_om,
                        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # Even inputs k0 + 2i sit in the low nibbles, odd ones in the high nibbles of byte k0 / 2 + i.
        byte = tl.load(w_ptr + cols[None, :] * (K // 2) + (k0 // 2 + half)[:, None],
                       mask=cols[None, :] < N, other=0)  # [BLOCK_K / 2, BLOCK_N]
        g = k0 // GROUP
        scale = tl.load(sz_ptr + (g * N + cols) * 2, mask=cols < N, other=0.0)
        zero = tl.load(sz_ptr + (g * N + cols) * 2 + 1, mask=cols < N, other=0.0)
        lo = ((byte & 0xF).to(tl.float32) - 8.0) * scale[None, :].to(tl.float32) + zero[None, :].to(tl.float32)
        hi = ((byte >> 4).to(tl.float32) - 8.0) * scale[None, :].to(tl.float32) + zero[None, :].to(tl.float32)
        x_even = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + 2 * half)[None, :],
                         mask=rows[:, None] < M, other=0.0)
        x_odd = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + 2 * half + 1)[None, :],
                        mask=rows[:, None] < M, other=0.0)
        if DOT_FP32:
            acc += tl.dot(x_even.to(tl.float32), lo, input_precision="ieee")
            acc += tl.dot(x_odd.to(tl.float32), hi, input_precision="ieee")
        else:
            acc += tl.dot(x_even, lo.to(x_even.dtype))
            acc += tl.dot(x_odd, hi.to(x_odd.dtype))
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def int4_matmul(x: Tensor, packed: Tensor, scales_zeros: Tensor, group_size: int) -> Tensor:
    """``x @ W.T`` for ``x: [M, K]`` (see ``kernels.int4_reference.int4_matmul``)."""
    m, k = x.shape
    n = packed.shape[0]
    if packed.shape != (n, k // 2) or scales_zeros.shape != (k // group_size, n, 2) or k % group_size:
        raise ValueError(f"int4_matmul: x {tuple(x.shape)}, packed {tuple(packed.shape)}, scales_zeros "
                         f"{tuple(scales_zeros.shape)} and group {group_size} do not fit together")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 64
    block_k = min(group_size, 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
    _int4_matmul_kernel[grid](x, packed, scales_zeros.contiguous(), out, m, n, k, x.stride(0), out.stride(0),
                              GROUP=group_size, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=block_k,
                              # The interpreter (numpy) has no bfloat16 matmul.
                              DOT_FP32=x.dtype == torch.float32 or (INTERPRETED and x.dtype == torch.bfloat16))
    return out
