"""Megatron-style sharding of the Llama model over `Group.size` ranks: what each rank keeps, and the checks.

Per layer, with N ranks:

- q/k/v and gate/up are column-parallel: rank r keeps heads `[r * H/N, (r+1) * H/N)` of q (and of k and v,
  with the KV heads) and the same share of the MLP's intermediate rows. No communication: each rank's
  attention runs on its own heads, reading and writing its own `kv_heads / N` of every KV block.
- o and down are row-parallel: rank r keeps the matching input columns; its partial output is summed over
  the ranks by one all-reduce each (`Linear(..., reduce_group=group)`).
- The embedding and the LM head are vocab-parallel: rank r keeps rows `[r * V', (r+1) * V')` of the table,
  `V' = ceil(V / N)` (the last shard padded with zero rows, so any vocabulary size splits). A token's
  embedding comes from the rank that holds its row (the others contribute zeros to one all-reduce); the
  logits are computed per shard and gathered to rank 0, which alone samples. Replicating them instead
  would save that all-reduce and gather but keep the largest weights of a small-vocabulary-heavy model
  (SmolLM2's tied table is a fifth of its weights, Llama 3's over a tenth) whole on every device, and the
  LM head's matmul unsplit: the memory tensor parallelism is for.
- Norms and RoPE tables are replicated.

Every rank's shard has the same shapes (padding included), so per-rank byte counts are rank 0's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from inference.linear import VocabEmbedding
from inference.parallel.group import Group

if TYPE_CHECKING:
    from inference.model import ModelConfig


def vocab_shard_rows(vocab_size: int, size: int) -> int:
    return -(-vocab_size // size)


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """Raise ValueError naming the first model dimension that `size` ranks cannot split evenly (the
    vocabulary always splits: its last shard is padded)."""
    for name, value in (("num_attention_heads", cfg.num_heads), ("num_key_value_heads", cfg.num_kv_heads),
                        ("intermediate_size", cfg.intermediate_size)):
        if value % size:
            raise ValueError(f"tensor_parallel_size={size} does not divide the model's {name}={value}; "
                             f"use a size that divides it")


class VocabParallelEmbedding(VocabEmbedding):
    """This rank's `vocab_shard_rows` rows of the token table, from row `rank * rows` on.

    A lookup gives zeros for tokens another rank holds; the all-reduce sums the one real row into every
    rank (exact: the other terms are zeros).
    """

    def __init__(self, vocab_size: int, hidden_size: int, group: Group) -> None:
        rows = vocab_shard_rows(vocab_size, group.size)
        super().__init__(rows, hidden_size)
        self.group, self.start = group, group.rank * rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return self.weight.rows(ids)
        local = ids - self.start
        outside = (local < 0) | (local >= self.vocab_size)
        rows = self.weight.rows(local.masked_fill(outside, 0))
        return self.group.all_reduce(rows.masked_fill_(outside.unsqueeze(-1), 0))


class WeightShards:
    """Which part of each checkpoint weight one rank keeps; `take` reads only that part from the file.

    Names are the loader's (HF names without "model."). Weights not listed (norms) are kept whole.
    """

    def __init__(self, cfg: ModelConfig, group: Group) -> None:
        self.rank, self.size = group.rank, group.size
        q, kv = cfg.num_heads // self.size * cfg.head_dim, cfg.num_kv_heads // self.size * cfg.head_dim
        mlp, vocab = cfg.intermediate_size // self.size, vocab_shard_rows(cfg.vocab_size, self.size)
        # module name -> (dimension split, rows or columns per rank)
        self.parts = {"q_proj": (0, q), "k_proj": (0, kv), "v_proj": (0, kv), "o_proj": (1, q),
                      "gate_proj": (0, mlp), "up_proj": (0, mlp), "down_proj": (1, mlp),
                      "embed_tokens": (0, vocab), "lm_head": (0, vocab)}

    def take(self, name: str, source) -> torch.Tensor:
        """This rank's part of weight `name`, a tensor or a safetensors slice (which reads only that part)."""
        parts = name.split(".")
        split = self.parts.get(parts[-2]) if len(parts) >= 2 else None
        if split is None or self.size == 1:
            return source[:]
        dim, length = split
        start = self.rank * length
        shape = source.get_shape() if hasattr(source, "get_shape") else list(source.shape)
        stop = max(start, min(start + length, shape[dim]))
        part = source[start:stop] if dim == 0 else source[:, start:stop]
        if stop - start < length:  # the last vocabulary shard: pad with zero rows
            part = torch.cat([part, part.new_zeros(length - (stop - start), *part.shape[1:])])
        return part.clone() if isinstance(source, torch.Tensor) else part
