"""Triton paged-attention kernels: same signatures and semantics as ``kernels.reference``.

Attention reads K/V in place through the block tables, tile by tile, with an online (flash-style) softmax in
float32; nothing is gathered into a contiguous copy first. Decode is GQA-aware: one program owns one KV head
of one sequence and serves all the query heads that share it, so each KV tile is loaded once. Long contexts
are split into partitions computed in parallel and merged by log-sum-exp (PagedAttention V2).

A sliding window (``window``, as ``kernels.reference`` defines it) is a compile-time switch (``SLIDING``), so the
full-attention kernels compile exactly as without it: with it, decode starts at the window's first position and
prefill tiles at their first row's, and prefill masks each row's keys before its own window. Soft-capping
(``softcap``, Gemma 2) is one too (``SOFTCAP``): the scaled score in natural units is capped, ``c * tanh(s / c)``
(tanh as ``1 - 2 / (exp(2x) + 1)``: triton.language has no tanh), then taken to the log2 units the kernels'
``exp2`` softmax works in.

Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (set before triton is imported).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels import reference, validation

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks",
           "rotary_embedding_", "rms_norm", "silu_and_mul", "gelu_tanh_and_mul"]

# Elementwise on the GPU already: torch's ops run them well enough beside the attention kernels.
rotary_embedding_ = reference.rotary_embedding_
rms_norm = reference.rms_norm
silu_and_mul = reference.silu_and_mul
gelu_tanh_and_mul = reference.gelu_tanh_and_mul

#: Tokens per decode partition; contexts longer than this are split across programs and merged.
PARTITION_SIZE = 512
_LOG2E = 1.4426950408889634
#: Triton's interpreter multiplies bfloat16 tiles as their raw uint16 bits, so there the attention dots run on
#: float32 copies (exact for bfloat16 inputs). Read at import, when ``triton.jit`` also reads it.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """Write each token's K/V (``[num_tokens, kv_heads, head_dim]``) into its slot, in place; slot -1 skips."""
    validation.check_cache_pair(key_cache, value_cache)
    validation.check_new_kv(key, value, key_cache, slot_mapping)
    _check_last_dim_contiguous(key=key, value=value, key_cache=key_cache, value_cache=value_cache)
    if key.shape[0] == 0:
        return
    _, block_size, kv_heads, head_dim = key_cache.shape
    _reshape_and_cache_kernel[(key.shape[0],)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        **reshape_and_cache_constexprs(block_size, kv_heads, head_dim))


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None,
                           window: int | None = None, softcap: float | None = None) -> Tensor:
    """One query token per sequence attending to its first ``context_lens[s]`` cached tokens (into ``out``).

    The partition count comes from the block-table width (no device sync): programs whose partition lies past
    their own sequence's context exit at once, and the merge only reads the partitions a sequence used.
    """
    _check_attention_inputs(query, key_cache, value_cache, block_tables, context_lens, block_tables.shape[0])
    validation.check_window(window)
    validation.check_softcap(softcap)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    out = validation.output_for(query, out)
    if num_seqs == 0:
        return out
    max_context = max(1, block_tables.shape[1] * block_size)
    num_partitions = triton.cdiv(max_context, PARTITION_SIZE)
    meta = decode_constexprs(num_heads, kv_heads, head_dim, block_size, query.dtype, num_partitions,
                             window is not None, softcap is not None)
    if meta["SPLIT"]:
        part_out = torch.empty(num_seqs, num_heads, num_partitions, head_dim, dtype=torch.float32,
                               device=query.device)
        part_max = torch.empty(num_seqs, num_heads, num_partitions, dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_out = part_max = part_sum = out  # unused when not split
    _decode_kernel[(num_seqs, kv_heads, num_partitions)](
        out, part_out, part_max, part_sum, query, key_cache, value_cache, block_tables, context_lens,
        scale * _LOG2E, num_partitions, window or 0, float(softcap or 0.0),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), block_tables.stride(0), **meta)
    if meta["SPLIT"]:
        _merge_partitions_kernel[(num_seqs, num_heads)](
            out, part_out, part_max, part_sum, context_lens, num_partitions, out.stride(0), out.stride(1),
            **merge_constexprs(head_dim, num_partitions))
    return out


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None, window: int | None = None,
                            softcap: float | None = None) -> Tensor:
    """Causal attention for a flattened varlen batch of new tokens, reading all K/V through block tables.

    Semantics as ``kernels.reference.paged_attention_prefill``. The grid has ``num_tokens // BLOCK_Q +
    num_seqs`` programs per KV head, enough to cover every sequence's query tiles without knowing the longest
    one on the host; each program finds its sequence by binary search over ``query_start_loc``.
    """
    num_seqs = block_tables.shape[0]
    _check_attention_inputs(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    validation.check_window(window)
    validation.check_softcap(softcap)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    out = validation.output_for(query, out)
    if num_tokens == 0 or num_seqs == 0:
        return out
    meta = prefill_constexprs(num_heads, kv_heads, head_dim, block_size, query.dtype, window is not None,
                              softcap is not None)
    _prefill_kernel[(num_tokens // meta["BLOCK_Q"] + num_seqs, kv_heads)](
        out, query, key_cache, value_cache, block_tables, context_lens, query_start_loc,
        scale * _LOG2E, num_seqs, window or 0, float(softcap or 0.0),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), block_tables.stride(0), **meta)
    return out


def copy_blocks(key_caches: list[Tensor], value_caches: list[Tensor], block_mapping: Tensor) -> None:
    """Copy physical block ``src -> dst`` for every ``(src, dst)`` row of ``block_mapping``, in every layer.

    One launch covers all layers: each cache is addressed as an element offset from the first one, so every
    cache must be contiguous with the same shape and dtype. Copies run in parallel, so a destination must
    not also be a source (copy-on-write always copies into fresh blocks).
    """
    validation.check_block_mapping(key_caches, value_caches, block_mapping)
    if block_mapping.numel() == 0 or not key_caches:
        return
    caches = [cache for pair in zip(key_caches, value_caches) for cache in pair]
    first = caches[0]
    for cache in caches:
        if not cache.is_contiguous() or cache.dtype != first.dtype or cache.device != first.device:
            raise ValueError("copy_blocks needs contiguous caches sharing one shape, dtype and device")
    offsets = [cache.data_ptr() - first.data_ptr() for cache in caches]
    if any(offset % first.element_size() for offset in offsets):
        raise ValueError("copy_blocks needs caches aligned to their element size")
    layer_offsets = torch.tensor([offset // first.element_size() for offset in offsets], dtype=torch.int64,
                                 device=first.device)
    mapping = block_mapping.to(device=first.device, dtype=torch.int64).contiguous()
    _copy_blocks_kernel[(len(caches), mapping.shape[0])](first, layer_offsets, mapping,
                                                         **copy_blocks_constexprs(first[0].numel()))


def decode_constexprs(num_heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                      num_partitions: int, sliding: bool = False, softcap: bool = False) -> dict:
    """Compile-time parameters of ``_decode_kernel`` for one model shape (also used by the compile check)."""
    group = num_heads // kv_heads
    return dict(GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
                DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size, BLOCK_N=64,
                PARTITION=PARTITION_SIZE, SPLIT=num_partitions > 1, DOT_FP32=_dot_in_fp32(dtype), SLIDING=sliding,
                SOFTCAP=softcap)


def merge_constexprs(head_dim: int, num_partitions: int) -> dict:
    """Compile-time parameters of ``_merge_partitions_kernel``."""
    return dict(HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim),
                PARTS_PAD=triton.next_power_of_2(num_partitions), PARTITION=PARTITION_SIZE)


def prefill_constexprs(num_heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                       sliding: bool = False, softcap: bool = False) -> dict:
    """Compile-time parameters of ``_prefill_kernel``: BLOCK_M rows = BLOCK_Q tokens x GROUP query heads."""
    group = num_heads // kv_heads
    block_m = max(64, triton.next_power_of_2(group))
    return dict(GROUP=group, HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
                BLOCK_M=block_m, BLOCK_Q=block_m // group, BLOCK_N=32, DOT_FP32=_dot_in_fp32(dtype),
                SLIDING=sliding, SOFTCAP=softcap)


def reshape_and_cache_constexprs(block_size: int, kv_heads: int, head_dim: int) -> dict:
    """Compile-time parameters of ``_reshape_and_cache_kernel``."""
    return dict(BLOCK_SIZE=block_size, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
                HEADS_PAD=triton.next_power_of_2(kv_heads), DIM_PAD=triton.next_power_of_2(head_dim))


def copy_blocks_constexprs(block_numel: int) -> dict:
    """Compile-time parameters of ``_copy_blocks_kernel``: copies one block in chunks of at most 4096."""
    return dict(BLOCK_NUMEL=block_numel, CHUNK=min(4096, triton.next_power_of_2(block_numel)))


def _check_attention_inputs(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, num_seqs: int) -> None:
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    _check_last_dim_contiguous(query=query, key_cache=key_cache, value_cache=value_cache)
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables rows must be contiguous")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise ValueError(f"query and caches must share one dtype, got {query.dtype}, {key_cache.dtype}, "
                         f"{value_cache.dtype}")


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    return dtype == torch.float32 or (INTERPRETED and dtype == torch.bfloat16)


def _check_last_dim_contiguous(**tensors: Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along head_dim")


@triton.jit
def _reshape_and_cache_kernel(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
                              stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_kcb, stride_kco, stride_kch, stride_vcb, stride_vco, stride_vch,
                              BLOCK_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                              HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < KV_HEADS) & (dims < HEAD_DIM)
    key = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(key_cache_ptr + block * stride_kcb + offset * stride_kco + heads * stride_kch + dims,
             key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + block * stride_vcb + offset * stride_vco + heads * stride_vch + dims,
             value.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend_tile(q, m_i, l_i, acc, key_cache_ptr, value_cache_ptr, table_ptr, start, limit, allowed_to,
                 allowed_from, kv_head, stride_kb, stride_ko, stride_kh, stride_vb, stride_vo, stride_vh, scale_log2,
                 softcap, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, WINDOWED: tl.constexpr, SOFTCAP: tl.constexpr):
    """One online-softmax step over KV positions ``start..start+BLOCK_N`` (those ``< limit``).

    ``allowed_to[r]`` is the last position row r may see (causality), and where ``WINDOWED``
    ``allowed_from[r]`` the first (its sliding window: a row may then see nothing of a tile, so a row's max
    stays -inf and is taken as 0 to keep its sums 0 rather than NaN); scores are in log2 units, capped first
    in natural units where ``SOFTCAP``.
    """
    positions = start + tl.arange(0, BLOCK_N)
    in_range = positions < limit
    blocks = tl.load(table_ptr + positions // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
    offsets = positions % BLOCK_SIZE
    dims = tl.arange(0, DIM_PAD)
    kv_mask = in_range[:, None] & (dims[None, :] < HEAD_DIM)
    keys = tl.load(key_cache_ptr + blocks[:, None] * stride_kb + offsets[:, None] * stride_ko
                   + kv_head * stride_kh + dims[None, :], mask=kv_mask, other=0.0)
    values = tl.load(value_cache_ptr + blocks[:, None] * stride_vb + offsets[:, None] * stride_vo
                     + kv_head * stride_vh + dims[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        scores = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(keys))
    visible = in_range[None, :] & (positions[None, :] <= allowed_to[:, None])
    if WINDOWED:
        visible = visible & (positions[None, :] >= allowed_from[:, None])
    if SOFTCAP:  # x = (scores * scale) / softcap; softcap * tanh(x), in log2 units
        x = scores * (scale_log2 / (1.4426950408889634 * softcap))
        scores = (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)) * (softcap * 1.4426950408889634)
    else:
        scores = scores * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    if WINDOWED:
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    alpha = tl.exp2(m_i - m_shift)
    probs = tl.exp2(scores - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(probs, axis=1)
    if DOT_FP32:
        acc = acc * alpha[:, None] + tl.dot(probs, values.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(probs.to(values.dtype), values)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, query_ptr, key_cache_ptr,
                   value_cache_ptr, block_tables_ptr, context_lens_ptr, scale_log2, num_partitions, window, softcap,
                   stride_qs, stride_qh, stride_os, stride_oh, stride_kb, stride_ko, stride_kh,
                   stride_vb, stride_vo, stride_vh, stride_bt,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PARTITION: tl.constexpr,
                   SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr):
    """Program (seq, kv_head, partition): the GROUP query heads of one KV head over one partition. With a window
    the tiles start at its first position, so nothing before it is read or masked (a partition wholly before it
    stores an empty softmax, weight 0 in the merge)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    partition = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    start = partition * PARTITION
    if SPLIT:
        if start >= context_len:
            return
    end = tl.minimum(start + PARTITION, context_len)
    if SLIDING:
        start = tl.maximum(start, context_len - window)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, DIM_PAD)
    q_mask = (rows[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(query_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :], mask=q_mask,
                other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    allowed_to = tl.full([GROUP_PAD], 2**31 - 1, dtype=tl.int32)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(start, end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, key_cache_ptr, value_cache_ptr, table_ptr, tile, end,
                                     allowed_to, allowed_to, kv_head, stride_kb, stride_ko, stride_kh, stride_vb,
                                     stride_vo, stride_vh, scale_log2, softcap, HEAD_DIM, DIM_PAD, BLOCK_SIZE,
                                     BLOCK_N, DOT_FP32, False, SOFTCAP)
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT:
        part = (seq * GROUP * tl.num_programs(1) + heads) * num_partitions + partition
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)
        tl.store(part_max_ptr + part, m_i, mask=rows < GROUP)
        tl.store(part_sum_ptr + part, l_i, mask=rows < GROUP)
    else:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _merge_partitions_kernel(out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, context_lens_ptr, num_partitions,
                             stride_os, stride_oh, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                             PARTS_PAD: tl.constexpr, PARTITION: tl.constexpr):
    """Program (seq, head): weight each used partition's normalised output by its share of the softmax sum."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    used = tl.cdiv(tl.load(context_lens_ptr + seq), PARTITION)
    parts = tl.arange(0, PARTS_PAD)
    dims = tl.arange(0, DIM_PAD)
    is_used = parts < used
    base = (seq * tl.num_programs(1) + head) * num_partitions
    part_max = tl.load(part_max_ptr + base + parts, mask=is_used, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + base + parts, mask=is_used, other=0.0)
    largest = tl.max(part_max, axis=0)
    weights = tl.exp2(part_max - tl.where(largest > float("-inf"), largest, 0.0)) * part_sum
    part_out = tl.load(part_out_ptr + (base + parts)[:, None] * HEAD_DIM + dims[None, :],
                       mask=is_used[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
    total = tl.sum(weights, axis=0)
    merged = tl.sum(part_out * weights[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims, merged.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


@triton.jit
def _find_sequence(query_start_loc_ptr, program, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence s whose query tiles own ``program``: the last s with ``start[s] // BLOCK_Q + s <= program``."""
    low = 0
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= program:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit
def _prefill_kernel(out_ptr, query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, context_lens_ptr,
                    query_start_loc_ptr, scale_log2, num_seqs, window, softcap,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_kb, stride_ko, stride_kh,
                    stride_vb, stride_vo, stride_vh, stride_bt,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                    DOT_FP32: tl.constexpr, SLIDING: tl.constexpr, SOFTCAP: tl.constexpr):
    """Program (query tile, kv_head): BLOCK_Q new tokens x GROUP query heads, packed as BLOCK_M rows. With a
    window, the KV tiles start at the first row's first visible position."""
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, program, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = program - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    token = tile * BLOCK_Q + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_valid = (rows // GROUP < BLOCK_Q) & (token < q_len)
    # Padding rows get positions >= the tile's own, so every row sees position 0 and stays finite.
    position = context_len - q_len + token
    dims = tl.arange(0, DIM_PAD)
    q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(query_ptr + (q_start + token)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh
                + dims[None, :], mask=q_mask, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    limit = tl.minimum(context_len, context_len - q_len + (tile + 1) * BLOCK_Q)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_key = 0
    if SLIDING:
        first_key = tl.maximum(0, context_len - q_len + tile * BLOCK_Q + 1 - window)
    for kv_start in range(first_key, limit, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, m_i, l_i, acc, key_cache_ptr, value_cache_ptr, table_ptr, kv_start, limit,
                                     position, position + 1 - window, kv_head, stride_kb, stride_ko, stride_kh,
                                     stride_vb, stride_vo, stride_vh, scale_log2, softcap, HEAD_DIM, DIM_PAD,
                                     BLOCK_SIZE, BLOCK_N, DOT_FP32, SLIDING, SOFTCAP)
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q_start + token)[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh
             + dims[None, :], acc.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _copy_blocks_kernel(first_cache_ptr, layer_offsets_ptr, mapping_ptr, BLOCK_NUMEL: tl.constexpr,
                        CHUNK: tl.constexpr):
    """Program (cache, pair): copy one physical block of one layer's K or V cache."""
    cache_ptr = first_cache_ptr + tl.load(layer_offsets_ptr + tl.program_id(0))
    pair = tl.program_id(1)
    src = tl.load(mapping_ptr + 2 * pair) * BLOCK_NUMEL
    dst = tl.load(mapping_ptr + 2 * pair + 1) * BLOCK_NUMEL
    for chunk in range(0, BLOCK_NUMEL, CHUNK):
        index = chunk + tl.arange(0, CHUNK)
        mask = index < BLOCK_NUMEL
        tl.store(cache_ptr + dst + index, tl.load(cache_ptr + src + index, mask=mask), mask=mask)
