"""Pure-torch reference implementations of the paged-attention ops.

These define the semantics the Triton kernels must match, and they are also the CPU engine's hot path, so
they are vectorised: the blocks a batch needs are gathered once (``index_select`` through the block tables)
into a padded ``[num_seqs, max_ctx, kv_heads, head_dim]`` tensor and attention runs as one batched, masked
SDPA call. Gathering copies K/V, which is exactly what the Triton kernels avoid; here it buys simplicity.

KV cache layout per layer: ``key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]``.
A token's slot is ``physical_block * block_size + offset``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels import validation

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks"]


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """Write each token's K/V (``[num_tokens, kv_heads, head_dim]``) into its slot, in place; slot -1 skips."""
    validation.check_cache_pair(key_cache, value_cache)
    validation.check_new_kv(key, value, key_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping.long()
    if not bool(keep.all()):
        key, value, slots = key[keep], value[keep], slots[keep]
    # index_copy_ into the flat [slots, kv_heads, head_dim] view: one pass, no 2-D advanced indexing.
    flat_shape = (-1, *key_cache.shape[2:])
    key_cache.view(flat_shape).index_copy_(0, slots, key.to(key_cache.dtype))
    value_cache.view(flat_shape).index_copy_(0, slots, value.to(value_cache.dtype))


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None) -> Tensor:
    """One query token per sequence attending to its first ``context_lens[s]`` cached tokens.

    ``query: [num_seqs, num_heads, head_dim]``; query head h reads KV head ``h // (num_heads // kv_heads)``.
    A sequence with context length 0 gets a zero output (useful for padded batches). The result is written
    into ``out`` when given (same shape and dtype as ``query``) and returned.
    """
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, query.shape[0])
    out = validation.output_for(query, out)
    if query.shape[0] == 0:
        return out
    mask = _positions(key_cache, context_lens)[None, None, :] < context_lens.long()[:, None, None]
    out.copy_(_attend(query[:, None], key_cache, value_cache, block_tables, context_lens, mask, scale)[:, 0])
    return out


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None) -> Tensor:
    """Causal attention for a flattened varlen batch of new tokens, reading all K/V through block tables.

    Sequence s owns query rows ``query_start_loc[s]:query_start_loc[s+1]``; ``context_lens[s]`` counts all its
    cached tokens including these new ones, so new token i sits at position ``context_lens[s] - q_len + i``
    and attends to positions ``0..that position``. Sequences with one new token take the decode path, so a
    mixed decode + prefill batch is not padded to its longest prompt. Writes into ``out`` when given.
    """
    num_seqs = block_tables.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    if bool((q_lens < 0).any()) or int(starts[-1]) != query.shape[0] or bool((q_lens > context_lens).any()):
        raise ValueError("query_start_loc must be non-decreasing, end at num_tokens, and give each sequence "
                         "at most context_lens[s] new tokens")

    out = validation.output_for(query, out)
    single = (q_lens == 1).nonzero()[:, 0]
    if single.numel():
        rows = starts[single]
        out[rows] = paged_attention_decode(query[rows], key_cache, value_cache, block_tables[single],
                                           context_lens[single], scale)
    multi = (q_lens > 1).nonzero()[:, 0]
    if multi.numel():
        lens = q_lens[multi]
        offsets = torch.arange(int(lens.max()), device=query.device)
        valid = offsets[None, :] < lens[:, None]                               # [m, max_q]
        rows = torch.where(valid, starts[multi, None] + offsets, 0)            # padded query rows -> row 0
        ctx = context_lens[multi].long()
        positions = ctx[:, None] - lens[:, None] + offsets                     # [m, max_q]
        mask = _positions(key_cache, ctx)[None, None, :] <= positions[:, :, None]
        res = _attend(query[rows], key_cache, value_cache, block_tables[multi], ctx, mask, scale)
        out[rows[valid]] = res[valid]
    return out


def copy_blocks(key_caches: list[Tensor], value_caches: list[Tensor], block_mapping: Tensor) -> None:
    """Copy physical block ``src -> dst`` for every ``(src, dst)`` row of ``block_mapping``, in every layer.

    Destinations must be distinct and must not be sources (see ``validation.check_block_mapping``).
    """
    validation.check_block_mapping(key_caches, value_caches, block_mapping)
    if block_mapping.numel() == 0:
        return
    for key_cache, value_cache in zip(key_caches, value_caches):
        mapping = block_mapping.to(key_cache.device).long()
        src, dst = mapping[:, 0], mapping[:, 1]
        key_cache.index_copy_(0, dst, key_cache.index_select(0, src))
        value_cache.index_copy_(0, dst, value_cache.index_select(0, src))


def _attend(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor, context_lens: Tensor,
            mask: Tensor, scale: float) -> Tensor:
    """Masked attention of padded queries ``[S, Q, heads, D]`` over each sequence's gathered K/V.

    ``mask: [S, Q, max_ctx]`` (True = attend), where max_ctx covers the longest context rounded up to whole
    blocks. Computes in float32 (float64 stays float64), returns the query's dtype; fully masked rows are 0.
    """
    compute = torch.promote_types(query.dtype, torch.float32)
    keys = _gather(key_cache, block_tables, context_lens).to(compute)        # [S, L, kv_heads, D]
    values = _gather(value_cache, block_tables, context_lens).to(compute)
    out = F.scaled_dot_product_attention(
        query.to(compute).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=mask[:, None], scale=scale, enable_gqa=True)                # [S, heads, Q, D]
    out = out.transpose(1, 2)
    out = torch.where(mask.any(-1)[:, :, None, None], out, 0.0)
    return out.to(query.dtype)


def _gather(cache: Tensor, block_tables: Tensor, context_lens: Tensor) -> Tensor:
    """The blocks covering each sequence's context, as ``[S, num_blocks * block_size, kv_heads, D]``.

    Only the blocks the longest context needs are read; table entries past a sequence's own context are
    padding (possibly garbage) and are replaced by block 0 so they never index out of range. Slots past the
    context are zeroed: they may hold anything (even NaN), and a masked score still multiplies its value.
    """
    block_size = cache.shape[1]
    num_blocks = _padded_length(context_lens, block_size) // block_size
    needed = torch.arange(num_blocks, device=cache.device) * block_size < context_lens.long()[:, None]
    table = torch.where(needed, block_tables[:, :num_blocks].long(), 0)
    gathered = cache.index_select(0, table.flatten()).view(table.shape[0], num_blocks * block_size,
                                                            *cache.shape[2:])
    past_context = torch.arange(num_blocks * block_size, device=cache.device) >= context_lens.long()[:, None]
    gathered[past_context.nonzero(as_tuple=True)] = 0  # integer indices: touches only those slots
    return gathered


def _positions(key_cache: Tensor, context_lens: Tensor) -> Tensor:
    """Token positions ``0..L-1``, L as in ``_padded_length``: the columns of the gathered K/V."""
    return torch.arange(_padded_length(context_lens, key_cache.shape[1]), device=key_cache.device)


def _padded_length(context_lens: Tensor, block_size: int) -> int:
    """The longest context rounded up to whole blocks (at least one block, so shapes are never empty)."""
    longest = int(context_lens.max()) if context_lens.numel() else 0
    return max(1, -(-longest // block_size)) * block_size
