"""Our own Llama-family forward pass over a flattened, unpadded batch of tokens from many sequences.

Tokens of every scheduled sequence are concatenated into one row of `num_tokens`; nothing is padded.
Attention writes each token's K and V into its slot of the paged cache, then reads the context only
through block tables (`kernels.paged_attention_*`). Weights load from a local HF folder (safetensors),
with q/k/v and gate/up fused into one matmul each; every weight matmul is an `inference.linear.Linear`.

Under tensor parallelism (`group.size > 1`) each rank builds this model with its share of the heads, the
MLP rows and the vocabulary, and loads only that share (inference/parallel/layers.py says which).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from inference.architectures import (
    ACTIVATIONS, Architecture, architecture, layer_windows, nope_layers, sliding_layers,
)
from inference.linear import Linear, LinearWeight, PackedFloatWeight
from inference.mla import LatentAttention, LatentKV, deinterleave_rope_rows
from inference.moe import MoEConfig, SparseMoE
from inference.parallel.group import Group
from inference.parallel.layers import VocabParallelEmbedding, WeightShards
from inference.quantization import QuantizationConfig, linear_weight
from inference.quantization.weights import Int4Codes
from inference.rope import inverse_frequencies, layer_rope_parameters, rope_parameters
from inference.weight_files import read_weights
from kernels import reference


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int]
    # What the family changes relative to the Llama block (inference/architectures.py) and its RoPE
    # (inference/rope.py: `rope_type`, `rope_theta` and the type's own keys).
    architecture: Architecture = field(default_factory=Architecture)
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    # Each layer's sliding window in tokens, None for full attention (`architectures.layer_windows`); empty:
    # every layer full.
    windows: list[int | None] = field(default_factory=list)
    moe: MoEConfig | None = None  # a mixture of experts (`architecture.moe`, inference/moe.py)
    # Latent attention (`architecture.mla`, inference/mla.py); then the cache holds one "KV head" per token
    # whose `head_dim` is the latent plus the RoPE key, and RoPE rotates `rope_dim` dimensions.
    mla: LatentKV | None = None
    nope_layers: tuple[int, ...] = ()  # layers that apply no RoPE (SmolLM3's)
    attention_scale: float | None = None  # None: head_dim ** -0.5 (`Architecture.scale_field` sets it)
    attn_softcap: float | None = None  # attention-logit soft cap (Gemma 2's attn_logit_softcapping)
    final_softcap: float | None = None  # final-logit soft cap (final_logit_softcapping)
    # RoPE of the sliding layers where the family gives them their own (Gemma 3's local base), and which layers
    # those are (by kind: `architectures.sliding_layers`, whether or not their window is None).
    local_rope: dict | None = None
    local_rope_layers: tuple[int, ...] = ()

    def window(self, layer: int) -> int | None:
        """`layer`'s sliding window, or None for full attention."""
        return self.windows[layer] if self.windows else None

    def is_sparse(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts."""
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def rope_dim(self) -> int:
        """Dimensions of a query or key head that RoPE rotates."""
        return self.head_dim if self.mla is None else self.mla.qk_rope_head_dim

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        """The folder's config.json, every field the engine does not implement refused by name."""
        cfg = json.loads((folder / "config.json").read_text())
        where = f"{folder}/config.json"
        arch = architecture(cfg, where)
        eos = cfg.get("eos_token_id")
        heads = cfg["num_attention_heads"]
        rope, local_rope = layer_rope_parameters(cfg, where) if arch.rope_per_layer_type else (
            rope_parameters(cfg, where), None)
        mla = LatentKV.from_config(cfg, rope) if arch.mla else None
        scale = cfg[arch.scale_field] ** -0.5 if arch.scale_field else None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=1 if mla else cfg.get("num_key_value_heads", heads),
            head_dim=mla.entry_dim if mla else cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False) or arch.qkv_bias,
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            architecture=arch,
            rope=rope,
            moe=MoEConfig.from_config(cfg, arch.moe, where) if arch.moe else None,
            mla=mla,
            windows=layer_windows(cfg, arch, where),
            nope_layers=nope_layers(cfg, arch, where),
            attention_scale=scale,
            attn_softcap=cfg.get("attn_logit_softcapping") if arch.softcapping else None,
            final_softcap=cfg.get("final_logit_softcapping") if arch.softcapping else None,
            local_rope=local_rope,
            local_rope_layers=tuple(i for i, sliding in enumerate(sliding_layers(cfg, arch, where) or []) if sliding)
            if local_rope else (),
        )


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what context each sequence attends to.

    slot_mapping[t]     physical slot (block * block_size + offset) for token t's K/V
    block_tables[s]     physical blocks of sequence s, padded with 0 past its context
    context_lens[s]     cached tokens of sequence s after this step (earlier context + new tokens)
    query_start_loc     sequence s owns query rows query_start_loc[s]:query_start_loc[s+1]
    is_decode           every sequence has exactly one new token (selects the decode kernel)
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    is_decode: bool


class RMSNorm(nn.Module):
    """HF Llama's RMSNorm. Gemma's `(1 + w)` form is this one with 1 + w folded into the weight at load (in
    float32, as HF adds it: the float32 forward is bit-equal to HF's)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: ModuleType = reference) -> torch.Tensor:
        """As HF Llama normalises (kernels/reference.py), through the step's kernel backend."""
        return ops.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """RoPE in the rotate-half layout HF uses; cos/sin precomputed for every position from the checkpoint's
    rope_type (inference/rope.py), scaled as HF scales them (YaRN's and LongRoPE's attention factor), over the
    rotated dimensions of a head (all of them but with `partial_rotary_factor`). LongRoPE's table is HF's for
    a sequence of `max_model_len` tokens (inference/rope.py says when that equals HF).

    `tables` looks a step's positions up once (the forward shares them across layers, saving two index ops
    and two casts per layer); the kernels' `rotary_embedding_` applies them to q and k in place.
    """

    def __init__(self, head_dim: int, max_positions: int, rope: dict, max_model_len: int | None = None) -> None:
        super().__init__()
        inv_freq, scale = inverse_frequencies(rope, head_dim, max_positions, max_model_len)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", freqs.cos() * scale, persistent=False)
        self.register_buffer("sin", freqs.sin() * scale, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every token's position, `[num_tokens, rotary_dim / 2]` in `dtype`, for the kernels'
        `rotary_embedding_` (kernels/reference.py)."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


class Attention(nn.Module):
    """This rank's heads: q/k/v column-parallel, o row-parallel (one all-reduce). With a `window`, each token
    attends to the last `window` positions up to its own (kernels/reference.py), else to all of them. `rotate`
    False: a NoPE layer (no RoPE on q and k). `local_rope`: the layer rotates by the model's second table
    (Gemma 3's windowed layers). Scores are scaled by `cfg.attention_scale` and capped by `cfg.attn_softcap`."""

    def __init__(self, cfg: ModelConfig, group: Group, window: int | None = None, rotate: bool = True,
                 local_rope: bool = False) -> None:
        super().__init__()
        self.window = window
        self.softcap = cfg.attn_softcap
        self.local_rope = local_rope
        self.num_heads, self.num_kv_heads = cfg.num_heads // group.size, cfg.num_kv_heads // group.size
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, reduce_group=group)
        self.scale = cfg.head_dim**-0.5 if cfg.attention_scale is None else cfg.attention_scale
        self.rotate = rotate
        self.qk_norm = None
        if cfg.architecture.qk_norm is not None:
            widths = (cfg.head_dim,) * 2 if cfg.architecture.qk_norm == "head" else (self.q_size, self.kv_size)
            self.qk_norm = nn.ModuleList(RMSNorm(width, cfg.rms_norm_eps) for width in widths)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        ops: ModuleType,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        # q's and k's heads are adjacent columns of the fused output: rotated together, in place.
        qk = qkv[:, : self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.qk_norm is not None:  # over each head, or over the whole projection (the norm's width says)
            for norm, part in zip(self.qk_norm, (qk[:, : self.num_heads], qk[:, self.num_heads :])):
                part.copy_(norm(part.reshape(-1, norm.weight.shape[0]), ops).view(part.shape))
        if self.rotate:
            ops.rotary_embedding_(qk, *rope)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        key_cache, value_cache = kv_cache
        ops.reshape_and_cache(k, v, key_cache, value_cache, meta.slot_mapping)
        if meta.is_decode:
            out = ops.paged_attention_decode(
                q, key_cache, value_cache, meta.block_tables, meta.context_lens, self.scale, window=self.window,
                softcap=self.softcap,
            )
        else:
            out = ops.paged_attention_prefill(
                q, key_cache, value_cache, meta.block_tables, meta.context_lens, meta.query_start_loc, self.scale,
                window=self.window, softcap=self.softcap,
            )
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    """This rank's intermediate rows: gate/up column-parallel, down row-parallel (one all-reduce); the gate's
    activation is the family's (`Architecture.activation`: SiLU, Gemma's tanh GELU)."""

    def __init__(self, cfg: ModelConfig, group: Group, intermediate_size: int | None = None) -> None:
        super().__init__()
        self.activation = ACTIVATIONS[cfg.architecture.activation]
        intermediate = (intermediate_size or cfg.intermediate_size) // group.size
        self.gate_up_proj = Linear(cfg.hidden_size, [intermediate, intermediate])
        self.down_proj = Linear(intermediate, cfg.hidden_size, reduce_group=group)

    def forward(self, x: torch.Tensor, ops: ModuleType = reference) -> torch.Tensor:
        return self.down_proj(getattr(ops, self.activation)(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Attention and MLP, each added to the residual stream, with the family's norms where it places them
    (`Architecture.layer_norms`: Llama's before each, OLMo 2's on each output); each norm is an attribute
    under its checkpoint name."""

    def __init__(self, cfg: ModelConfig, group: Group, index: int) -> None:
        super().__init__()
        if cfg.mla:
            self.self_attn = LatentAttention(cfg, RMSNorm)
        else:
            self.self_attn = Attention(cfg, group, cfg.window(index), rotate=index not in cfg.nope_layers,
                                       local_rope=index in cfg.local_rope_layers)
        if cfg.is_sparse(index):
            shared = cfg.moe.shared_intermediate_size
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe, MLP(cfg, group, shared) if shared else None)
        else:
            self.mlp = MLP(cfg, group)
        for name in filter(None, cfg.architecture.layer_norms):
            setattr(self, name, RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        # (attention input, attention output, MLP input, MLP output): a plain tuple, the modules registered above
        self.norms = tuple(name and getattr(self, name) for name in cfg.architecture.layer_norms)

    def step(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
             kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, ops: ModuleType) -> torch.Tensor:
        """The residual stream after this layer (a method, not `forward`: no module hooks per layer)."""
        attn_in, attn_out, mlp_in, mlp_out = self.norms
        x = self.self_attn(h if attn_in is None else attn_in(h, ops), rope, kv_cache, meta, ops)
        h = h + (x if attn_out is None else attn_out(x, ops))
        x = self.mlp(h if mlp_in is None else mlp_in(h, ops), ops)
        return h + (x if mlp_out is None else mlp_out(x, ops))


class LlamaForCausalLM(nn.Module):
    """`cfg` is the whole model's; with a `group` of several ranks, this is rank `group.rank`'s shard."""

    def __init__(self, cfg: ModelConfig, group: Group | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.group = group = group or Group.single()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, group)
        self.layers = nn.ModuleList(DecoderLayer(cfg, group, i) for i in range(cfg.num_layers))
        # `ops.decoder_layers`' windows: per layer (0 for full attention), or none where every layer is full.
        self.stack_windows = [cfg.window(i) or 0 for i in range(cfg.num_layers)] if any(cfg.windows) else []
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.rope)
        self.local_rope = None if cfg.local_rope is None else RotaryEmbedding(
            cfg.rope_dim, cfg.max_position_embeddings, cfg.local_rope)
        self.lm_head = Linear(cfg.hidden_size, self.embed_tokens.vocab_size)  # vocab-parallel, like the table

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        ops: ModuleType,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [num_tokens, hidden], or only at token rows `rows` (those a step
        samples), [len(rows), hidden]. Every token's K/V is cached either way. The one-call CPU stack runs the
        last layer past its K/V for those rows alone (a prompt of hundreds of tokens samples one: ~3% of a
        prefill's matmuls saved); the layer-by-layer path computes every row and picks them at the end."""
        h = self.embed_tokens(input_ids)
        if self.cfg.architecture.scaled_embeddings:
            # HF's normaliser: sqrt(hidden) as a float32 tensor, cast to the activations' dtype
            h = h * torch.tensor(self.cfg.hidden_size**0.5, dtype=torch.float32).to(h.dtype)
        rope = self.rope.tables(positions, h.dtype)
        local = None if self.local_rope is None else self.local_rope.tables(positions, h.dtype)
        stack = self._stack_weights(ops)
        if stack is not None:
            return ops.decoder_layers(h, stack, kv_caches, *rope, meta.slot_mapping, meta.block_tables,
                                      meta.context_lens, meta.query_start_loc, self.layers[0].self_attn.num_heads,
                                      self.layers[0].self_attn.scale, self.norm.eps, rows, self.stack_windows)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer.step(h, local if layer.self_attn.local_rope else rope, kv_cache, meta, ops)
        return self.norm(h if rows is None else h[rows], ops)

    def _stack_weights(self, ops: ModuleType) -> list[torch.Tensor] | None:
        """The weights `ops.decoder_layers` takes when the step can run as one C++ call (kernels/cpu_kernels.py):
        six per layer (input norm, q/k/v, o, post-attention norm, gate/up, down) and the final norm. None where
        the layers must run here: a backend without it, a family that departs from the Llama block (q/k norm,
        other norm placement, NoPE layers, experts, latent attention), tensor parallelism, LoRA, a bias, or a weight
        not in oneDNN's packed layout (a quantized one). Partial rotary runs in it (its rotary reads the table's
        width). The list is made once; LoRA, installed after loading, is checked every step."""
        if not hasattr(ops, "decoder_layers") or not self.cfg.architecture.llama_block or self.cfg.nope_layers:
            return None
        if not hasattr(self, "_stack"):
            linears = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                        layer.mlp.down_proj) for layer in self.layers]
            self._stack_linears = [m for four in linears for m in four]
            fits = self.group.size == 1 and all(isinstance(m.weight, PackedFloatWeight) and m.bias is None
                                                for m in self._stack_linears)
            self._stack = None
            if fits:
                self._stack = [t for layer, (qkv, o, gate_up, down) in zip(self.layers, linears) for t in (
                    layer.input_layernorm.weight, qkv.weight.packed, o.weight.packed,
                    layer.post_attention_layernorm.weight, gate_up.weight.packed, down.weight.packed)]
                self._stack.append(self.norm.weight)
        if self._stack is None or any(m.lora is not None for m in self._stack_linears):
            return None
        return self._stack

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """float32 logits over the whole vocabulary on rank 0 (each rank's shard gathered); None elsewhere.
        A final soft cap (Gemma's final_logit_softcapping) applies in the model's dtype, as HF applies it."""
        logits = self.lm_head(hidden)
        if self.cfg.final_softcap is not None:
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        logits = self.group.gather_columns(logits.float())
        return None if logits is None else logits[:, : self.cfg.vocab_size]


def load_model(folder: Path, device: torch.device, dtype: torch.dtype,
               quant: QuantizationConfig | None = None, group: Group | None = None,
               max_model_len: int | None = None) -> LlamaForCausalLM:
    """Build the model and fill it from the folder's weights (or `quant`'s GGUF), fusing q/k/v and gate/up.

    Each layer's weight is stored as `quant` says (`inference.quantization.linear_weight`); float by default.
    With a `group` of several ranks, only this rank's shard of each weight is read and kept. `max_model_len`
    (the engine's; None: max_position_embeddings) picks LongRoPE's table (inference/rope.py).
    """
    cfg = ModelConfig.from_folder(folder)
    group = group or Group.single()
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, group)
    # Only the norms are filled in place; every Linear and the embedding receive their weight objects from
    # `load`, so float placeholders for weights that will be quantized are never allocated.
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.to_empty(device=device)
    model.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.rope, max_model_len).to(device)
    if cfg.local_rope is not None:
        model.local_rope = RotaryEmbedding(cfg.rope_dim, cfg.max_position_embeddings, cfg.local_rope,
                                           max_model_len).to(device)
    weights = read_weights(folder, quant, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                           WeightShards(cfg, group), cfg.architecture.fused_weights)
    source = folder if quant is None or quant.gguf_file is None else quant.gguf_file

    def take(name: str) -> torch.Tensor | Int4Codes:
        try:
            return weights.pop(name)
        except KeyError:
            raise ValueError(f"{source}: weight {name!r} is missing; is this a Llama-family model?") from None

    def weight(*names: str, embedding: bool = False) -> LinearWeight:
        """The layer weight fused from `names` (in output order), on the model's device."""
        return linear_weight(quant, [take(name) for name in names], embedding, device, dtype)

    def linear(module: Linear, name: str, *sources: str, bias: torch.Tensor | None = None) -> None:
        """Install the weight fused from `sources` (in output order); a shape error names the layer."""
        try:
            module.load(weight(*sources), bias)
        except ValueError as exc:
            raise ValueError(f"{source}: {name}: {exc}") from None

    def norm(module: RMSNorm, name: str) -> None:
        value = take(name + ".weight")
        if module.weight.shape != value.shape:
            raise ValueError(f"{source}: {name} has shape {tuple(value.shape)}, expected {tuple(module.weight.shape)}")
        if cfg.architecture.unit_offset_norms:  # Gemma's (1 + w), added in float32 as HF adds it
            value = 1.0 + value.float()
        module.weight.data.copy_(value)

    def load_experts(module: SparseMoE, block: str) -> None:
        if quant is not None and quant.method not in ("int8", "int4"):
            raise ValueError(f"{source}: quantization={quant.method!r} of a mixture of experts is not implemented "
                             "(its experts load as float, int8 or int4 weights)")
        spec = cfg.architecture.moe
        experts = [tuple(take(f"{block}experts.{e}.{name}.weight") for name in spec.expert_weights)
                   for e in range(cfg.moe.num_experts)]
        try:
            if quant is None:
                module.load(take(block + "gate.weight"), experts, dtype, device)
            else:
                module.load(take(block + "gate.weight"), experts, dtype, device, quant.method, quant.group_size)
        except ValueError as exc:
            raise ValueError(f"{source}: {block.rstrip('.')}: {exc}") from None
        if module.shared is not None:
            shared = f"{block}{spec.shared_experts}."
            linear(module.shared.gate_up_proj, shared + "gate_up_proj", shared + "gate_proj.weight",
                   shared + "up_proj.weight")
            linear(module.shared.down_proj, shared + "down_proj", shared + "down_proj.weight")

    def load_latent_attention(module: LatentAttention, attn: str) -> None:
        """DeepSeek's names; the RoPE rows of the query and latent projections reordered for our kernels."""
        if quant is not None:
            raise ValueError(f"{source}: quantization={quant.method!r} of latent attention is not implemented")
        mla = cfg.mla

        def rope_rows(name: str, group: int) -> LinearWeight:
            value = deinterleave_rope_rows(take(attn + name + ".weight"), group, mla.qk_rope_head_dim)
            return linear_weight(None, [value], False, device, dtype)

        query = "q_b_proj" if mla.q_lora_rank else "q_proj"
        if mla.q_lora_rank:
            linear(module.q_a_proj, attn + "q_a_proj", attn + "q_a_proj.weight")
            norm(module.q_a_layernorm, attn + "q_a_layernorm")
        module.q_proj.load(rope_rows(query, mla.qk_nope_head_dim + mla.qk_rope_head_dim))
        module.kv_a_proj.load(rope_rows("kv_a_proj_with_mqa", mla.entry_dim))
        norm(module.kv_a_layernorm, attn + "kv_a_layernorm")
        module.load_kv_b(take(attn + "kv_b_proj.weight").to(device))
        linear(module.o_proj, attn + "o_proj", attn + "o_proj.weight")

    try:
        model.embed_tokens.load(weight("embed_tokens.weight", embedding=True))
    except ValueError as exc:
        raise ValueError(f"{source}: embed_tokens: {exc}") from None
    norm(model.norm, "norm")
    if cfg.tie_word_embeddings:
        model.lm_head.load(model.embed_tokens.weight)
    else:
        linear(model.lm_head, "lm_head", "lm_head.weight")  # untied: a linear layer like the others
    for i, layer in enumerate(model.layers):
        attn, mlp = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        if isinstance(layer.self_attn, LatentAttention):
            load_latent_attention(layer.self_attn, attn)
        else:
            bias = None
            if cfg.attention_bias:
                bias = torch.cat([take(attn + f"{x}_proj.bias") for x in "qkv"]).to(device)
            linear(layer.self_attn.qkv_proj, attn + "qkv_proj", *(attn + f"{x}_proj.weight" for x in "qkv"),
                   bias=bias)
            linear(layer.self_attn.o_proj, attn + "o_proj", attn + "o_proj.weight")
        if isinstance(layer.mlp, SparseMoE):
            load_experts(layer.mlp, f"layers.{i}.{cfg.architecture.moe.block}.")
        else:
            linear(layer.mlp.gate_up_proj, mlp + "gate_up_proj", mlp + "gate_proj.weight", mlp + "up_proj.weight")
            linear(layer.mlp.down_proj, mlp + "down_proj", mlp + "down_proj.weight")
        for name in filter(None, cfg.architecture.layer_norms):
            norm(getattr(layer, name), f"layers.{i}.{name}")
        if layer.self_attn.qk_norm is not None:
            for module, x in zip(layer.self_attn.qk_norm, "qk"):
                norm(module, attn + f"{x}_norm")
    leftover = [name for name in weights if not name.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise ValueError(f"{source}: weights this Llama-family loader does not use: {leftover[:5]}")
    return pack_cpu_weights(model.to(dtype).eval())


def pack_cpu_weights(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Hold every float linear weight on the CPU in oneDNN's packed layout (`PackedFloatWeight`). The token
    table stays plain for the embedding's row lookups; a tied lm_head gets a packed copy of it (the one
    weight kept twice: the head is a fifth of SmolLM2's multiply, and 3x faster packed)."""
    for module in model.modules():
        if isinstance(module, Linear) and PackedFloatWeight.packs(module.weight):
            module.weight = PackedFloatWeight(module.weight)
    return model
