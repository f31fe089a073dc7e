"""Multi-head latent attention (DeepSeek-V2) over the paged cache: each token's cache entry is its compressed
KV latent (`kv_lora_rank` values) and its one shared RoPE key (`qk_rope_head_dim`), not a key and a value per
KV head.

HF transformers decompresses every cached latent into per-head keys and values at every step
(`kv_b_proj`). We never do: the decompression is absorbed into the query and the output instead, so a step's
work on the context is one pass over the latent entries, which is what makes the small cache fast to read.
With `W_UK[h]` and `W_UV[h]` the key and value rows of `kv_b_proj` for head h, and `c` a token's latent:

    score(h)  = q_nope[h] · (W_UK[h] c) + q_pe[h] · k_pe  =  [q_nope[h] W_UK[h] ; q_pe[h]] · [c ; k_pe]
    output(h) = W_UV[h] (Σ p c)

So attention is multi-query attention with one "KV head" whose key is the cache entry `[c ; k_pe]`, over
queries `[q_nope W_UK ; q_pe]`; its values are the entries' first `kv_lora_rank` values, read from the same
tensor (the kernels get it as both key and value cache and the output's tail is dropped). Decode, prefill,
chunked prefill and prefix-cached suffixes all run through the ordinary paged kernels of every backend, and
the block manager, copy-on-write, preemption and beam search see nothing new: one layer's pool is one tensor
`[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]`.

DeepSeek rotates RoPE pairs of adjacent dimensions (2i, 2i+1); our kernels rotate halves (i, i + d/2). The
loader reorders the RoPE rows of the query and latent projections to the halves layout
(`deinterleave_rope_rows`); a dot product of two vectors permuted alike is unchanged, so scores are HF's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from inference.linear import Linear

if TYPE_CHECKING:
    from inference.model import AttentionMetadata, ModelConfig, RMSNorm


@dataclass(frozen=True)
class LatentKV:
    """A checkpoint's latent attention, from its config.json (`ModelConfig.mla`)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float

    @property
    def entry_dim(self) -> int:
        """Values one token's cache entry holds in one layer: the latent and the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_config(cls, cfg: dict[str, Any], rope: dict[str, Any]) -> LatentKV:
        """The scale is HF's: 1/sqrt(nope + rope dims), times YaRN's `mscale_all_dim` correction squared."""
        nope, rope_dim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        scale = (nope + rope_dim) ** -0.5
        if rope["rope_type"] != "default" and rope.get("mscale_all_dim") and rope.get("factor", 1) > 1:
            scale *= (0.1 * rope["mscale_all_dim"] * math.log(rope["factor"]) + 1.0) ** 2
        return cls(cfg["kv_lora_rank"], cfg.get("q_lora_rank"), nope, rope_dim, cfg["v_head_dim"], scale)


class LatentAttention(nn.Module):
    """One layer's MLA: the query (directly, or through DeepSeek's low-rank `q_a` / `q_b`), the latent
    projection, the absorbed `W_UK` / `W_UV`, and `o_proj`."""

    def __init__(self, cfg: ModelConfig, norm: type[RMSNorm]) -> None:
        super().__init__()
        mla = cfg.mla
        self.num_heads, self.nope, self.rope, self.rank = (cfg.num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                                                           mla.kv_lora_rank)
        self.v_dim = mla.v_head_dim
        q_size = self.num_heads * (self.nope + self.rope)
        if mla.q_lora_rank:
            self.q_a_proj = Linear(cfg.hidden_size, mla.q_lora_rank)
            self.q_a_layernorm = norm(mla.q_lora_rank, cfg.rms_norm_eps)
            self.q_proj = Linear(mla.q_lora_rank, q_size)
        else:
            self.q_a_proj = self.q_a_layernorm = None
            self.q_proj = Linear(cfg.hidden_size, q_size)
        self.kv_a_proj = Linear(cfg.hidden_size, self.rank + self.rope)
        self.kv_a_layernorm = norm(self.rank, cfg.rms_norm_eps)
        self.register_buffer("w_uk", torch.empty(self.num_heads, self.nope, self.rank))
        self.register_buffer("w_uv", torch.empty(self.num_heads, self.v_dim, self.rank))
        self.o_proj = Linear(self.num_heads * self.v_dim, cfg.hidden_size)
        self.scale = mla.softmax_scale
        # The attention interface the model reads of every layer (inference/model.py `Attention`): latent
        # attention has neither q/k norms nor a local RoPE table.
        self.qk_norm = None
        self.local_rope = False

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        ops: ModuleType,
    ) -> torch.Tensor:
        tokens, heads = x.shape[0], self.num_heads
        if self.q_a_proj is not None:
            x_q = self.q_a_layernorm(self.q_a_proj(x), ops)
        else:
            x_q = x
        q = self.q_proj(x_q).view(tokens, heads, self.nope + self.rope)
        latent = self.kv_a_proj(x)
        # The query heads' RoPE parts and the one shared RoPE key, rotated together in place.
        pe = torch.cat([q[:, :, self.nope:], latent[:, None, self.rank:]], dim=1)
        ops.rotary_embedding_(pe, *rope)
        query = torch.cat([torch.einsum("thn,hnc->thc", q[:, :, : self.nope], self.w_uk), pe[:, :heads]], dim=-1)
        entry = torch.cat([self.kv_a_layernorm(latent[:, : self.rank], ops), pe[:, heads]], dim=-1).unsqueeze(1)
        cache = kv_cache[0]  # the layer's one latent tensor (kv_cache[1] is the same tensor)
        ops.reshape_and_cache(entry, entry, cache, cache, meta.slot_mapping)
        if meta.is_decode:
            out = ops.paged_attention_decode(query, cache, cache, meta.block_tables, meta.context_lens, self.scale)
        else:
            out = ops.paged_attention_prefill(query, cache, cache, meta.block_tables, meta.context_lens,
                                              meta.query_start_loc, self.scale)
        values = torch.einsum("thc,hvc->thv", out[..., : self.rank], self.w_uv)
        return self.o_proj(values.reshape(tokens, heads * self.v_dim))

    def load_kv_b(self, kv_b: torch.Tensor) -> None:
        """Split `kv_b_proj` ([heads * (nope + v), rank]) into the absorbed `W_UK` and `W_UV`."""
        want = (self.num_heads * (self.nope + self.v_dim), self.rank)
        if tuple(kv_b.shape) != want:
            raise ValueError(f"kv_b_proj has shape {tuple(kv_b.shape)}, expected {want}")
        per_head = kv_b.view(self.num_heads, self.nope + self.v_dim, self.rank)
        self.w_uk = per_head[:, : self.nope].contiguous()
        self.w_uv = per_head[:, self.nope :].contiguous()


def deinterleave_rope_rows(weight: torch.Tensor, group: int, rope: int) -> torch.Tensor:
    """Reorder the last `rope` rows of every `group` rows from DeepSeek's adjacent pairs (0, 1), (2, 3), ... to
    the halves layout the rotary kernels rotate: even rows first, then odd ones."""
    rows = weight.view(-1, group, *weight.shape[1:])
    order = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)]) + (group - rope)
    out = rows.clone()
    out[:, group - rope :] = rows[:, order]
    return out.view(weight.shape)
