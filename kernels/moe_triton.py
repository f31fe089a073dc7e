"""Triton fused mixture-of-experts for CUDA; semantics: ``kernels.moe_reference.fused_moe``.

The shape of vLLM's fused_moe, written for this engine. A step's (token, pick) pairs (``P = T * k`` of them,
pair ``p = t * k + j``) are sorted by expert and each expert's run is padded to a multiple of ``BLOCK_M``
(``align_by_expert``), so every block of ``BLOCK_M`` sorted pairs belongs to one expert. Then two grouped GEMMs
run, each program one ``[BLOCK_M, BLOCK_N]`` tile of one block:

1. gate/up: the block's token rows of ``x`` times its expert's gate rows and up rows (two accumulators over
   the same ``x`` tile), SiLU-and-mul applied in registers, ``[P, I]`` stored: the ``[P, 2I]`` gate/up output
   is never written out;
2. down: those rows times the expert's down weight, scaled by each pair's router weight, ``[P, H]`` in float32;

and the ``k`` rows of each token are summed. Padding rows load nothing and store nothing. The block count is
bounded without reading the routing back to the host (``ceil(P / BLOCK_M) + E``), so a step never syncs;
programs of unused blocks exit at once. Quantized experts are weight-only (float activations): int8 loads its
codes and scales each output row's sum once; int4 splits each byte's two codes and applies the K step's group
scale and zero before the dot (a step never crosses a group). Set ``TRITON_INTERPRET=1`` before importing to run it on the CPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe_reference import check_moe_inputs, in_features, int4_group_size

__all__ = ["fused_moe", "align_by_expert", "INTERPRETED"]

#: The interpreter (numpy) has no bfloat16 matmul, so there the dots run on float32 copies.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def align_by_expert(experts: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor]:
    """The pairs sorted by expert into blocks of ``block_m``: ``sorted_pairs [num_blocks * block_m]`` (pair ids,
    ``P`` for padding) and ``block_experts [num_blocks]`` (each block's expert, -1 past the last used block).

    ``num_blocks`` is an upper bound that needs no host sync: each expert's run wastes at most one partial
    block, so ``ceil(P / block_m) + E`` blocks always suffice. Within an expert, pairs keep ascending order.
    """
    flat = experts.flatten()
    pairs = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    rank = torch.arange(pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[by_expert]
    num_blocks = triton.cdiv(pairs, block_m) + num_experts
    sorted_pairs = torch.full((num_blocks * block_m,), pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[(padded_ends - padded)[by_expert] + rank] = order.to(torch.int32)
    block_experts = torch.searchsorted(padded_ends // block_m, torch.arange(num_blocks, device=flat.device),
                                       right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return sorted_pairs, block_experts


@triton.jit
def _dot(acc, a, b, DOT_FP32: tl.constexpr):
    if DOT_FP32:
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return acc + tl.dot(a, b.to(a.dtype))


@triton.jit
def _int4_dot(acc, a_even, a_odd, b_base, sz_base, cols, col_ok, k0, stride_bn, stride_sg,
              GROUP: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc + this K step of ``a @ W[cols].T`` for int4 rows ``cols``: even inputs in the low nibbles, odd in the
    high ones of byte ``k0 / 2 + i`` (``kernels.int4_reference``); one group's scale and zero for the step."""
    half = tl.arange(0, BLOCK_K // 2)
    byte = tl.load(b_base + cols[None, :] * stride_bn + (k0 // 2 + half)[:, None], mask=col_ok[None, :], other=0)
    sz = sz_base + (k0 // GROUP) * stride_sg + cols * 2
    scale = tl.load(sz, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    zero = tl.load(sz + 1, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    lo = ((byte & 0xF).to(tl.float32) - 8.0) * scale + zero
    hi = ((byte >> 4).to(tl.float32) - 8.0) * scale + zero
    return _dot(_dot(acc, a_even, lo, DOT_FP32), a_odd, hi, DOT_FP32)


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, scales_ptr, out_ptr, sorted_pairs_ptr, block_experts_ptr, pair_weights_ptr,
                         num_pairs, N, K, pairs_per_row, stride_am, stride_be, stride_bn, stride_se, stride_sg,
                         stride_om, GATED: tl.constexpr, INT8: tl.constexpr, INT4: tl.constexpr,
                         GROUP: tl.constexpr, MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """out[p, n] for the block's pairs p: row ``p // pairs_per_row`` of A times row n of the block's expert's B
    (``[E, N, K]``; with GATED, rows n and N + n, combined as silu(gate) * up)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = pairs // pairs_per_row
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    half = tl.arange(0, BLOCK_K // 2)
    b_base = b_ptr + expert.to(tl.int64) * stride_be
    scales_base = scales_ptr + expert.to(tl.int64) * stride_se
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if INT4:  # K is a multiple of BLOCK_K, which divides the group
            a_row = a_ptr + rows[:, None] * stride_am + (k0 + 2 * half)[None, :]
            a_even = tl.load(a_row, mask=valid[:, None], other=0.0)
            a_odd = tl.load(a_row + 1, mask=valid[:, None], other=0.0)
            acc = _int4_dot(acc, a_even, a_odd, b_base, scales_base, cols, col_ok, k0, stride_bn, stride_sg,
                            GROUP, BLOCK_K, DOT_FP32)
            if GATED:
                acc_up = _int4_dot(acc_up, a_even, a_odd, b_base, scales_base, cols + N, col_ok, k0, stride_bn,
                                   stride_sg, GROUP, BLOCK_K, DOT_FP32)
        else:
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + ks)[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            b_mask = k_ok[:, None] & col_ok[None, :]
            b = tl.load(b_base + cols[None, :] * stride_bn + (k0 + ks)[:, None], mask=b_mask, other=0)  # [BK, BN]
            acc = _dot(acc, a, b, DOT_FP32)
            if GATED:
                b_up = tl.load(b_base + (cols + N)[None, :] * stride_bn + (k0 + ks)[:, None], mask=b_mask, other=0)
                acc_up = _dot(acc_up, a, b_up, DOT_FP32)
    if INT8:  # one scale per output row, applied once to the sum
        acc = acc * tl.load(scales_base + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(scales_base + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(pair_weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + pairs[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])


def fused_moe(x: Tensor, gate_up: Tensor, down: Tensor, experts: Tensor, weights: Tensor,
              gate_up_scales: Tensor | None = None, down_scales: Tensor | None = None) -> Tensor:
    """The routed experts' weighted sum for each token, ``[T, H]`` in ``x``'s dtype (see the module docstring)."""
    check_moe_inputs(x, gate_up, down, experts, weights, gate_up_scales, down_scales)
    num_tokens, hidden = x.shape
    num_experts, intermediate = gate_up.shape[0], gate_up.shape[1] // 2
    top_k = experts.shape[1]
    pairs = num_tokens * top_k
    if pairs == 0:
        return torch.zeros_like(x)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    block_m = 16 if pairs <= 64 * num_experts else 64  # few pairs per expert (decode): small blocks waste less
    sorted_pairs, block_experts = align_by_expert(experts, num_experts, block_m)
    pair_weights = weights.reshape(-1).float().contiguous()
    dot_fp32 = x.dtype == torch.float32 or (INTERPRETED and x.dtype == torch.bfloat16)
    act = torch.empty(pairs, intermediate, dtype=x.dtype, device=x.device)
    _launch(x, gate_up, gate_up_scales, act, sorted_pairs, block_experts, pair_weights, top_k, block_m, dot_fp32,
            gated=True)
    out = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    _launch(act, down, down_scales, out, sorted_pairs, block_experts, pair_weights, 1, block_m, dot_fp32,
            gated=False)
    return out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)


def _launch(a: Tensor, b: Tensor, scales: Tensor | None, out: Tensor, sorted_pairs: Tensor, block_experts: Tensor,
            pair_weights: Tensor, pairs_per_row: int, block_m: int, dot_fp32: bool, gated: bool) -> None:
    """One grouped GEMM: gate/up (`gated`: SiLU-and-mul of the two halves of b's rows) or down (times the
    router weights) over every block of sorted pairs."""
    n = b.shape[1] // 2 if gated else b.shape[1]
    k = in_features(b)
    int4 = b.dtype == torch.uint8
    scales = pair_weights if scales is None else scales.contiguous()  # any pointer where there are none
    group = int4_group_size(b, scales) if int4 else 1
    grid = (block_experts.numel(), triton.cdiv(n, 64))
    _grouped_gemm_kernel[grid](
        a, b, scales, out, sorted_pairs, block_experts, pair_weights, pair_weights.numel(), n, k, pairs_per_row,
        a.stride(0), b.stride(0), b.stride(1), scales.stride(0) if scales.dim() > 1 else 0,
        scales.stride(1) if int4 else 0, out.stride(0), GATED=gated, INT8=b.dtype == torch.int8, INT4=int4,
        GROUP=group, MUL_WEIGHT=not gated, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=min(group, 32) if int4 else 32,
        DOT_FP32=dot_fp32)
