"""Argument checks shared by the reference and Triton backends, so both reject bad input the same way."""

from __future__ import annotations

import torch
from torch import Tensor


def check_cache_pair(key_cache: Tensor, value_cache: Tensor) -> None:
    """Both caches must be ``[num_blocks, block_size, kv_heads, head_dim]`` with the same shape."""
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError("key_cache and value_cache must both be [num_blocks, block_size, kv_heads, head_dim], "
                         f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}")


def check_new_kv(key: Tensor, value: Tensor, key_cache: Tensor, slot_mapping: Tensor) -> None:
    """New K/V must be ``[num_tokens, kv_heads, head_dim]`` with one slot per token."""
    if key.shape != value.shape or key.dim() != 3 or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(f"key/value must be [num_tokens, {key_cache.shape[2]}, {key_cache.shape[3]}], "
                         f"got {tuple(key.shape)} and {tuple(value.shape)}")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must be [{key.shape[0]}], got {tuple(slot_mapping.shape)}")


def check_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                    context_lens: Tensor, num_seqs: int) -> None:
    """Shapes of an attention call: query heads a multiple of KV heads, one table row and length per sequence."""
    check_cache_pair(key_cache, value_cache)
    kv_heads, head_dim = key_cache.shape[2:]
    if query.dim() != 3 or query.shape[2] != head_dim or query.shape[1] % kv_heads:
        raise ValueError(f"query must be [tokens, heads, {head_dim}] with heads a multiple of {kv_heads}, "
                         f"got {tuple(query.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    if context_lens.shape != (num_seqs,):
        raise ValueError(f"context_lens must be [{num_seqs}], got {tuple(context_lens.shape)}")


def output_for(query: Tensor, out: Tensor | None) -> Tensor:
    """``out`` checked to match ``query`` (shape, dtype, device, contiguous), or a fresh tensor like it."""
    if out is None:
        return torch.empty_like(query, memory_format=torch.contiguous_format)
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(f"out must match query: {tuple(query.shape)} {query.dtype} on {query.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    return out


def check_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """``x: [tokens, heads, head_dim]`` (even head_dim, last dim contiguous) and ``cos, sin: [tokens,
    rotary_dim / 2]`` (``rotary_dim`` at most head_dim) in its dtype and on its device."""
    if x.dim() != 3 or x.shape[2] % 2 or x.stride(2) != 1:
        raise ValueError(f"x must be [tokens, heads, head_dim] with an even, contiguous head_dim, got "
                         f"{tuple(x.shape)} with strides {x.stride()}")
    half = cos.shape[1] if cos.dim() == 2 and 0 < cos.shape[1] <= x.shape[2] // 2 else x.shape[2] // 2
    want = (x.shape[0], half)
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != want or table.dtype != x.dtype or table.device != x.device:
            raise ValueError(f"{name} must be {list(want)} {x.dtype} on {x.device} (rotary_dim / 2 columns, "
                             f"at most head_dim / 2), got {tuple(table.shape)} {table.dtype} on {table.device}")


def check_rms_norm(x: Tensor, weight: Tensor) -> None:
    """``weight: [hidden]`` for ``x: [..., hidden]``, in its dtype and on its device."""
    if weight.shape != (x.shape[-1],) or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"weight must be [{x.shape[-1]}] {x.dtype} on {x.device}, "
                         f"got {tuple(weight.shape)} {weight.dtype} on {weight.device}")


def check_silu_and_mul(x: Tensor) -> None:
    """``x: [..., 2 * inter]``: a fused [gate | up] output."""
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x must be [..., 2 * inter] (gate then up), got {tuple(x.shape)}")


def check_query_start_loc(query_start_loc: Tensor, num_seqs: int) -> None:
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"query_start_loc must be [{num_seqs + 1}], got {tuple(query_start_loc.shape)}")


def check_block_mapping(key_caches: list[Tensor], value_caches: list[Tensor], block_mapping: Tensor) -> None:
    """One value cache per key cache; ``(src, dst)`` pairs whose destinations are distinct and never sources.

    Copies may run in parallel, so a chain (a block copied out of and into in one call) has no defined order.
    """
    if len(key_caches) != len(value_caches):
        raise ValueError(f"got {len(key_caches)} key caches but {len(value_caches)} value caches")
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [num_pairs, 2], got {tuple(block_mapping.shape)}")
    pairs = block_mapping.tolist()
    sources = {src for src, _ in pairs}
    destinations = [dst for _, dst in pairs]
    if len(set(destinations)) != len(destinations) or sources.intersection(destinations):
        raise ValueError("block_mapping destinations must be distinct and must not also be sources")
    for key_cache, value_cache in zip(key_caches, value_caches):
        check_cache_pair(key_cache, value_cache)
        if key_cache.shape != key_caches[0].shape:
            raise ValueError("every layer's cache must have the same shape")
    num_blocks = key_caches[0].shape[0] if key_caches else 0
    if any(not 0 <= block < num_blocks for pair in pairs for block in pair):
        raise ValueError(f"block_mapping entries must be physical blocks in [0, {num_blocks})")


def check_window(window: int | None) -> None:
    """A sliding window is None (full attention) or a positive number of tokens."""
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window must be None or a positive int, got {window!r}")
