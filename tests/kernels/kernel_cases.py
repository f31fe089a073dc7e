"""Randomised paged-attention cases and the float64 dense oracle they are checked against.

A case starts from contiguous per-sequence K/V, scatters them into a NaN-filled paged cache through a
shuffled block assignment, and pads the block tables with garbage: a kernel that reads an unused slot, a
padding table entry or a block of another sequence produces NaN or a wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: (atol, rtol) against the float64 oracle, per dtype of the inputs.
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}


@dataclass
class PagedCase:
    query: Tensor                # [num_tokens, num_heads, head_dim]
    key_cache: Tensor            # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: Tensor
    block_tables: Tensor         # [num_seqs, max_blocks] int32, padded with garbage
    context_lens: Tensor         # [num_seqs] int32
    query_start_loc: Tensor      # [num_seqs + 1] int32
    keys: list[Tensor]           # contiguous K per sequence, [context_len, kv_heads, head_dim]
    values: list[Tensor]
    scale: float


def build_case(*, block_size: int, num_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
               context_lens: list[int], query_lens: list[int], seed: int, device: torch.device) -> PagedCase:
    """A batch whose sequence s has ``context_lens[s]`` cached tokens, the last ``query_lens[s]`` of them new."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3                      # spare blocks nobody owns stay NaN
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq, default=0) + 2
    tables = torch.randint(-1, num_blocks, (len(context_lens), width), generator=gen, dtype=torch.int32)
    key_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    keys, values = [], []
    for seq, (length, owned) in enumerate(zip(context_lens, blocks_per_seq)):
        k = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
        blocks = torch.tensor([physical.pop() for _ in range(owned)], dtype=torch.int32)
        tables[seq, :owned] = blocks
        positions = torch.arange(length)
        key_cache[blocks[positions // block_size].long(), positions % block_size] = k
        value_cache[blocks[positions // block_size].long(), positions % block_size] = v
        keys.append(k.to(device))
        values.append(v.to(device))
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    query = torch.randn(int(starts[-1]), num_heads, head_dim, generator=gen).to(dtype)
    return PagedCase(query.to(device), key_cache.to(device), value_cache.to(device), tables.to(device),
                     torch.tensor(context_lens, dtype=torch.int32, device=device), starts.to(device),
                     keys, values, 1.0 / math.sqrt(head_dim))


def dense_attention(case: PagedCase, window: int | None = None, softcap: float | None = None) -> Tensor:
    """Float64 causal GQA attention from the contiguous K/V: the oracle for both backends. With a ``window``, a
    query at position p sees only keys p - window < k <= p (transformers' sliding_window_overlay); with a
    ``softcap`` each scaled score s is ``softcap * tanh(s / softcap)`` (Gemma 2's eager attention)."""
    out = torch.zeros(case.query.shape, dtype=torch.float64, device=case.query.device)
    group = case.query.shape[1] // case.key_cache.shape[2]
    starts = case.query_start_loc.tolist()
    for seq, (k, v) in enumerate(zip(case.keys, case.values)):
        q = case.query[starts[seq]:starts[seq + 1]].double()
        q_len, length = q.shape[0], k.shape[0]
        if length == 0 or q_len == 0:
            continue
        k = k.double().repeat_interleave(group, dim=1)
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        positions = torch.arange(length - q_len, length, device=q.device)
        future = torch.arange(length, device=q.device)[None, :] > positions[:, None]
        if window is not None:
            future |= torch.arange(length, device=q.device)[None, :] <= positions[:, None] - window
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        out[starts[seq]:starts[seq + 1]] = torch.einsum("hqk,khd->qhd", weights, v)
    return out


def assert_close_to(actual: Tensor, expected: Tensor, dtype: torch.dtype) -> None:
    """``actual`` matches ``expected`` within the tolerance of ``dtype`` (NaN anywhere fails)."""
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


def poisoned_like(tensor: Tensor) -> Tensor:
    """An output buffer full of NaN, so any element a kernel forgets to write fails the comparison."""
    return torch.full_like(tensor, float("nan"))
