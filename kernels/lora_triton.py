"""Triton shrink/expand kernels for the batched LoRA delta: same semantics as ``kernels.lora``.

One shrink program per token row computes ``x[t] @ a[s].T`` into a float32 ``[num_tokens, max_rank]``
buffer; expand programs (a row and a tile of output columns each) add ``buf[t] @ b[s].T`` into ``y``.
A row whose slot is -1 (base model) or whose slot has rank 0 for this layer is masked out of every load
and store: nothing is added to it, not even a zero. The stacks are read in place; nothing is gathered.

Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (set before triton is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.lora import LoRAIndex, check_lora_args

__all__ = ["add_lora"]

BLOCK_K = 64
BLOCK_N = 64


@triton.jit
def _row_slot(slots_ptr, ranks_ptr, t, features):
    """Row t's slot (0 for a base row, safe to index with) and the counts its masks compare against: its
    rank and `features`, both 0 for a base row or a rank-0 slot, so nothing is read or written for it."""
    slot = tl.load(slots_ptr + t)
    safe_slot = tl.maximum(slot, 0)
    rank = tl.where(slot >= 0, tl.load(ranks_ptr + safe_slot), 0)
    return safe_slot, rank, tl.where(rank > 0, features, 0)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, ranks_ptr, buf_ptr, in_features,
                   stride_xt, stride_as, stride_ar, stride_bt,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    safe_slot, rank, num_in = _row_slot(slots_ptr, ranks_ptr, t, in_features)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < rank
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < num_in
        xv = tl.load(x_ptr + t * stride_xt + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        av = tl.load(a_ptr + safe_slot * stride_as + offs_r[:, None] * stride_ar + offs_k[None, :],
                     mask=mask_r[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(buf_ptr + t * stride_bt + offs_r, acc, mask=mask_r)


@triton.jit
def _expand_kernel(buf_ptr, b_ptr, slots_ptr, ranks_ptr, y_ptr, out_features,
                   stride_bt, stride_bs, stride_bn, stride_yt,
                   BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    tile = tl.program_id(1)
    safe_slot, rank, num_out = _row_slot(slots_ptr, ranks_ptr, t, out_features)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < rank
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < num_out
    shrunk = tl.load(buf_ptr + t * stride_bt + offs_r, mask=mask_r, other=0.0)
    bv = tl.load(b_ptr + safe_slot * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
                 mask=mask_n[:, None] & mask_r[None, :], other=0.0).to(tl.float32)
    delta = tl.sum(bv * shrunk[None, :], axis=1)
    y_rows = y_ptr + t * stride_yt + offs_n
    yv = tl.load(y_rows, mask=mask_n, other=0.0)
    tl.store(y_rows, (yv.to(tl.float32) + delta).to(yv.dtype), mask=mask_n)


def add_lora(y: Tensor, x: Tensor, a: Tensor, b: Tensor, ranks: Tensor, index: LoRAIndex) -> None:
    """See ``kernels.lora``. ``y`` may be a column slice of a fused output (its rows strided)."""
    check_lora_args(y, x, a, b, ranks, index)
    num_tokens = index.num_tokens
    if num_tokens == 0 or not index.groups:
        return
    for name, t in (("x", x), ("y", y), ("a", a), ("b", b)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    max_rank = a.shape[1]
    block_r = max(16, triton.next_power_of_2(max_rank))
    buf = torch.empty(num_tokens, max_rank, dtype=torch.float32, device=x.device)
    ranks = ranks.to(torch.int32)
    _shrink_kernel[(num_tokens,)](x, a, index.token_slots, ranks, buf, x.shape[1],
                                  x.stride(0), a.stride(0), a.stride(1), buf.stride(0),
                                  BLOCK_R=block_r, BLOCK_K=BLOCK_K)
    out_features = y.shape[1]
    _expand_kernel[(num_tokens, triton.cdiv(out_features, BLOCK_N))](
        buf, b, index.token_slots, ranks, y, out_features,
        buf.stride(0), b.stride(0), b.stride(1), y.stride(0),
        BLOCK_R=block_r, BLOCK_N=BLOCK_N)
