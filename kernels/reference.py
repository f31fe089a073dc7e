"""Pure-torch reference implementations of the paged-attention ops.

These define the semantics the Triton kernels must match, and they are also the CPU engine's hot path, so
they avoid padding: decode gathers one row per (sequence, block) through the block tables (``index_select``)
and runs batched matmuls with a softmax summed across each sequence's blocks; prefill runs one causal SDPA
call per prefilling sequence over exactly its context. Gathering copies K/V, which is exactly what the
Triton kernels avoid; here it buys simplicity.

KV cache layout per layer: ``key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]``.
A token's slot is ``physical_block * block_size + offset``.

Sliding windows: with ``window=W`` (an int), a query at position p attends to the keys at positions k with
``p - W < k <= p`` (W keys, its own included), as transformers' ``masking_utils.sliding_window_overlay``
(``kv_idx > q_idx - sliding_window``) on top of the causal mask, for Mistral, Qwen2/3 and Gemma alike.
``window=None`` is full causal attention. Blocks wholly before every query's window are not read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels import validation

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks",
           "rotary_embedding_", "rms_norm", "silu_and_mul"]


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """Write each token's K/V (``[num_tokens, kv_heads, head_dim]``) into its slot, in place; slot -1 skips.

    A slot past the cache raises IndexError before anything is written: on CUDA an out-of-range
    ``index_copy_`` is a device-side assert, which leaves the process's CUDA context unusable."""
    validation.check_cache_pair(key_cache, value_cache)
    validation.check_new_kv(key, value, key_cache, slot_mapping)
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if slot_mapping.numel() and bool((slot_mapping >= num_slots).any()):
        raise IndexError(f"slot_mapping holds a slot past the cache's {num_slots} slots")
    keep = slot_mapping >= 0
    slots = slot_mapping.long()
    if not bool(keep.all()):
        key, value, slots = key[keep], value[keep], slots[keep]
    # index_copy_ into the flat [slots, kv_heads, head_dim] view: one pass, no 2-D advanced indexing.
    flat_shape = (-1, *key_cache.shape[2:])
    key_cache.view(flat_shape).index_copy_(0, slots, key.to(key_cache.dtype))
    value_cache.view(flat_shape).index_copy_(0, slots, value.to(value_cache.dtype))


def silu_and_mul(x: Tensor) -> Tensor:
    """The gated MLP's activation: ``silu(gate) * up`` for ``x = [gate | up]`` (the fused gate_up output)."""
    validation.check_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim exactly as HF Llama computes it: normalise in float32, cast back to ``x``'s
    dtype, then multiply by ``weight`` (in that dtype)."""
    validation.check_rms_norm(x, weight)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotary_embedding_(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """Rotate every head of ``x: [num_tokens, heads, head_dim]`` in place by its token's position, in the
    rotate-half layout HF Llama uses; ``cos, sin: [num_tokens, rotary_dim / 2]`` in ``x``'s dtype. Only the
    first ``rotary_dim`` dimensions of a head turn (HF's partial rotary, Phi-4-mini's: ``rotary_dim <
    head_dim``), the rest are left as they are. Callers pass q's and k's heads at once (a view of the fused
    qkv output)."""
    validation.check_rotary(x, cos, sin)
    half = cos.shape[1]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    x[..., : 2 * half].copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None,
                           window: int | None = None) -> Tensor:
    """One query token per sequence attending to its first ``context_lens[s]`` cached tokens (its last
    ``window`` of them with a sliding window: see the module's docstring).

    ``query: [num_seqs, num_heads, head_dim]``; query head h reads KV head ``h // (num_heads // kv_heads)``.
    A sequence with context length 0 gets a zero output (useful for padded batches). The result is written
    into ``out`` when given (same shape and dtype as ``query``) and returned.
    """
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, query.shape[0])
    validation.check_window(window)
    out = validation.output_for(query, out)
    if query.shape[0] == 0:
        return out
    out.copy_(_decode_blockwise(query, key_cache, value_cache, block_tables, context_lens, scale, window))
    return out


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None, window: int | None = None) -> Tensor:
    """Causal attention for a flattened varlen batch of new tokens, reading all K/V through block tables.

    Sequence s owns query rows ``query_start_loc[s]:query_start_loc[s+1]``; ``context_lens[s]`` counts all its
    cached tokens including these new ones, so new token i sits at position ``context_lens[s] - q_len + i``
    and attends to positions ``0..that position`` (with a ``window``, the last ``window`` of them). Sequences
    with one new token take the decode path, so a mixed decode + prefill batch is not padded to its longest
    prompt. Writes into ``out`` when given.
    """
    num_seqs = block_tables.shape[0]
    validation.check_attention(query, key_cache, value_cache, block_tables, context_lens, num_seqs)
    validation.check_query_start_loc(query_start_loc, num_seqs)
    validation.check_window(window)
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
                                           context_lens[single], scale, window=window)
    for seq in (q_lens > 1).nonzero()[:, 0].tolist():
        start, q_len = int(starts[seq]), int(q_lens[seq])
        out[start:start + q_len] = _prefill_one(query[start:start + q_len], key_cache, value_cache,
                                                block_tables[seq], int(context_lens[seq]), scale, window)
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


def _decode_blockwise(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                      context_lens: Tensor, scale: float, window: int | None) -> Tensor:
    """Decode attention block by block, as PagedAttention computes it: no padding to the longest context.

    Every (sequence, logical block) pair that holds context becomes one row: its physical block's K/V are
    gathered as ``[pairs, block_size, kv_heads * D]``, scores are taken per pair, and the softmax is summed
    across each sequence's pairs (max, exp, sums by ``index_add``). Query head h of group k reads KV head k:
    grouping the query heads per KV head would need K/V transposed (a copy as large as the gather), so the
    query is multiplied as a block-diagonal ``[heads, kv_heads * D]`` matrix instead, which costs kv_heads x
    the (small) score FLOPs and copies nothing. Computes in float32 (float64 stays float64). With a window,
    the pairs start at the block holding the window's first position, and the keys before it are masked.
    """
    num_seqs, num_heads, head_dim = query.shape
    kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    compute = torch.promote_types(query.dtype, torch.float32)
    device = query.device
    ctx = context_lens.long()
    blocks_held = -(-ctx // block_size)
    held = torch.arange(int(blocks_held.max()), device=device) < blocks_held[:, None]
    if window is not None:  # the query sits at ctx - 1 and sees positions from ctx - window on
        held &= torch.arange(held.shape[1], device=device) >= (ctx - window).clamp(min=0)[:, None] // block_size
    seq, logical = held.nonzero(as_tuple=True)
    physical = block_tables[seq, logical].long()
    keys = key_cache.flatten(1).index_select(0, physical).view(-1, block_size, kv_heads * head_dim).to(compute)
    values = value_cache.flatten(1).index_select(0, physical).view(-1, block_size, kv_heads * head_dim).to(compute)
    key_positions = logical[:, None] * block_size + torch.arange(block_size, device=device)
    past_context = key_positions >= ctx[seq, None]
    values[past_context.nonzero(as_tuple=True)] = 0  # the last block's tail may hold anything, even NaN
    unseen = past_context if window is None else past_context | (key_positions < ctx[seq, None] - window)

    eye = torch.eye(kv_heads, dtype=compute, device=device)
    grouped = query.to(compute).view(num_seqs, kv_heads, -1, head_dim) * scale
    block_diagonal = torch.einsum("skgd,kj->skgjd", grouped, eye).reshape(num_seqs, num_heads, -1)
    scores = torch.bmm(block_diagonal[seq], keys.transpose(1, 2))                       # [pairs, heads, block]
    scores.masked_fill_(unseen[:, None], float("-inf"))
    seq_max = torch.full((num_seqs, num_heads), float("-inf"), dtype=compute, device=device)
    seq_max.scatter_reduce_(0, seq[:, None].expand(-1, num_heads), scores.amax(-1), "amax")
    weights = torch.exp(scores - seq_max[seq][..., None])
    total = torch.zeros(num_seqs, num_heads, dtype=compute, device=device).index_add_(0, seq, weights.sum(-1))
    mixed = torch.zeros(num_seqs, num_heads, kv_heads * head_dim, dtype=compute, device=device)
    mixed.index_add_(0, seq, torch.bmm(weights, values))
    own_head = mixed.view(num_seqs, kv_heads, -1, kv_heads, head_dim).diagonal(dim1=1, dim2=3)  # [S, g, D, kv]
    attended = own_head.permute(0, 3, 1, 2).reshape(num_seqs, num_heads, head_dim) / total[..., None]
    return torch.where((ctx > 0)[:, None, None], attended, 0.0).to(query.dtype)  # empty context: 0, not NaN



def _prefill_one(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, context_len: int,
                 scale: float, window: int | None) -> Tensor:
    """Causal attention of one sequence's ``q_len`` new tokens over its ``context_len`` cached tokens.

    One SDPA call per prefilling sequence: a step holds few of them, and unpadded calls neither compute
    attention for padding nor read a slot past the context (which may hold anything, even NaN). With a window,
    the keys start at the block holding the first new token's first visible position.
    """
    block_size = key_cache.shape[1]
    q_len = query.shape[0]
    compute = torch.promote_types(query.dtype, torch.float32)
    first_block = 0 if window is None else max(0, context_len - q_len - window + 1) // block_size
    first = first_block * block_size  # position of the first key read
    blocks = block_table[first_block: -(-context_len // block_size)].long()
    keys = key_cache.index_select(0, blocks).flatten(0, 1)[:context_len - first].to(compute)  # [keys, kv_heads, D]
    values = value_cache.index_select(0, blocks).flatten(0, 1)[:context_len - first].to(compute)
    # New token i sits at position context_len - q_len + i and sees positions 0..that one (the window's last).
    positions = torch.arange(context_len - q_len, context_len, device=query.device)
    key_positions = torch.arange(first, context_len, device=query.device)[None, :]
    mask = key_positions <= positions[:, None]  # [q_len, keys]
    if window is not None:
        mask &= key_positions > positions[:, None] - window
    out = F.scaled_dot_product_attention(
        query.to(compute).transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True)                                   # [1, heads, q_len, D]
    return out[0].transpose(0, 1).to(query.dtype)
