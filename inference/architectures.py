"""What each model family changes relative to the Llama block, and which config.json fields the engine reads.

The model (inference/model.py) is the Llama decoder block. An `Architecture` names what a family does
differently, and the model code reads its fields rather than asking which family it is. Every field of a
config.json is one of: read by the loader (`READ_FIELDS`), harmless for inference (`HARMLESS_FIELDS`:
bookkeeping, training-only settings, generation defaults that generation_config.json states), or checked to
hold a value the engine implements (`check_config`). Any other field is refused by name, so a checkpoint never
loads silently wrong.

Sliding windows are stated per layer by `layer_windows` (None: full attention), as HF's family code derives
them; the attention kernels take the layer's window (kernels/reference.py says the exact mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The Llama block's norms: before attention, and before the MLP (HF names it after attention).
LLAMA_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP (inference/moe.py) in place of the dense one, and where its weights live."""

    block: str  # the checkpoint's module holding the router (`<block>.gate`) and `<block>.experts.<e>.`
    expert_weights: tuple[str, str, str]  # each expert's gate, up and down projections, as the checkpoint names them
    intermediate_field: str  # the config field giving each expert's intermediate size
    normalize: str  # renormalise the top-k router weights "always" (Mixtral), "never" (DeepSeek-V2), or as
    #                 the named config field says (Qwen3-MoE: "norm_topk_prob")
    router_float32: bool = False  # the router's logits in float32 whatever the activations (DeepSeek)
    shared_experts: str | None = None  # the module of a dense MLP beside the experts (DeepSeek: "shared_experts")


@dataclass(frozen=True)
class Architecture:
    """One family's departures from the Llama block; all unset is the Llama block itself."""

    qkv_bias: bool = False  # q/k/v carry a bias whatever `attention_bias` says (Qwen2)
    # q and k RMS-normalised before RoPE: "head", each head (weights [head_dim], Qwen3); "projection", the whole
    # q and k projections (weights [heads * head_dim], OLMo 2).
    qk_norm: str | None = None
    # The checkpoint names of a layer's norms at (attention input, attention output, MLP input, MLP output);
    # None where there is none. An output norm applies to the sub-layer's output before the residual add.
    layer_norms: tuple[str | None, str | None, str | None, str | None] = LLAMA_NORMS
    # SmolLM3's NoPE layers: `no_rope_layers` (1 where a layer applies RoPE, 0 where not) or, absent, every
    # `no_rope_layer_interval`-th layer (this default when that is absent too) applies none.
    nope_interval: int | None = None
    # Checkpoint tensors holding several projections (Phi-3): (fused module, its parts in output order). Split
    # when read (inference/weight_files.py), so everything after sees the Llama names.
    fused_weights: tuple[tuple[str, tuple[str, ...]], ...] = ()
    reads: frozenset[str] = frozenset()  # config fields this family alone reads (others refuse them)
    # Sliding windows (`layer_windows`): whether HF's family applies `sliding_window` at all (where not, the
    # window fields are refused by name), the field that must be true for it to apply (Qwen's), whether the
    # family reads `layer_types` (Mistral's ignores it), and without `layer_types` the field naming the first
    # windowed layer (Qwen's `max_window_layers`; None: every layer, as Mistral).
    window: bool = False
    window_switch: str | None = None
    reads_layer_types: bool = False
    window_from_layer: str | None = None
    moe: MoE | None = None  # sparse MLP layers (Qwen3-MoE, Mixtral, DeepSeek-V2)
    mla: bool = False  # multi-head latent attention (inference/mla.py; DeepSeek-V2)

    @property
    def llama_block(self) -> bool:
        """Whether a layer is the Llama block's (up to biases): what the one-call C++ decoder stack runs."""
        return self.qk_norm is None and self.layer_norms == LLAMA_NORMS and self.moe is None and not self.mla


QWEN_WINDOW = dict(window=True, window_switch="use_sliding_window", reads_layer_types=True,
                   window_from_layer="max_window_layers")

ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(),
    "mistral": Architecture(window=True),
    "qwen2": Architecture(qkv_bias=True, **QWEN_WINDOW),
    "qwen3": Architecture(qk_norm="head", **QWEN_WINDOW),
    "olmo2": Architecture(qk_norm="projection",
                          layer_norms=(None, "post_attention_layernorm", None, "post_feedforward_layernorm")),
    # SmolLM3 windows the layers `layer_types` names, under use_sliding_window (HF derives them from the NoPE
    # layers when absent: `nope_layers` refuses that case).
    "smollm3": Architecture(nope_interval=4, reads=frozenset({"no_rope_layers", "no_rope_layer_interval"}),
                            window=True, window_switch="use_sliding_window", reads_layer_types=True),
    # Phi-3 windows every layer when sliding_window is set (Phi-3-mini-4k's 2,047), as Mistral.
    "phi3": Architecture(fused_weights=(("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                        ("mlp.gate_up_proj", ("gate_proj", "up_proj"))),
                         reads=frozenset({"original_max_position_embeddings"}), window=True),
    # HF's Qwen3-MoE and Mixtral window every layer (Qwen3-MoE's under use_sliding_window; neither reads
    # max_window_layers or layer_types).
    "qwen3_moe": Architecture(qk_norm="head", window=True, window_switch="use_sliding_window",
                              moe=MoE("mlp", ("gate_proj", "up_proj", "down_proj"), "moe_intermediate_size",
                                      normalize="norm_topk_prob")),
    "mixtral": Architecture(window=True, moe=MoE("block_sparse_moe", ("w1", "w3", "w2"), "intermediate_size",
                                                 normalize="always")),
    "deepseek_v2": Architecture(mla=True, moe=MoE("mlp", ("gate_proj", "up_proj", "down_proj"),
                                                  "moe_intermediate_size", normalize="never", router_float32=True,
                                                  shared_experts="shared_experts")),
}

# Read by `ModelConfig.from_folder` (inference/model.py), inference/rope.py and inference.quantization.
READ_FIELDS = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
    "partial_rotary_factor", "max_position_embeddings", "tie_word_embeddings", "attention_bias", "eos_token_id",
    "quantization_config",
    # Mixture of experts (inference/moe.py MoEConfig): older configs say num_experts, transformers 5
    # num_local_experts, DeepSeek n_routed_experts.
    "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "n_routed_experts", "n_shared_experts", "routed_scaling_factor",
    "topk_method", "n_group", "topk_group", "first_k_dense_replace",
    # Multi-head latent attention (inference/mla.py LatentKV).
    "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim",
})

# Fields that do not change a forward pass: file bookkeeping, training-only settings, token ids the tokenizer
# states, and the generation defaults older transformers wrote into every config (sampling is the request's
# SamplingParams, with generation_config.json's suggestions: inference/generation_config.py).
HARMLESS_FIELDS = frozenset({
    "_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "use_cache",
    "initializer_range", "attention_dropout", "resid_pdrop", "embd_pdrop", "pretraining_tp", "output_hidden_states",
    "output_attentions",
    "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "id2label", "label2id",
    "problem_type", "pad_token_id", "bos_token_id", "unk_token_id", "sep_token_id", "decoder_start_token_id",
    "tokenizer_class", "use_bfloat16", "tf_legacy_loss", "torchscript", "pruned_heads", "add_cross_attention",
    "cross_attention_hidden_size", "tie_encoder_decoder", "finetuning_task", "prefix", "task_specific_params",
    "_attn_implementation_autoset", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
    "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens",
    # Training-only settings of a mixture of experts (the load-balancing loss, router noise).
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
})

# field -> the value the engine implements (a field absent from the file is taken to hold it).
IMPLEMENTED_VALUES: dict[str, Any] = {"hidden_act": "silu", "mlp_bias": False, "use_mrope": False}

# A mixture of experts' own fields, refused in a family without one (they would be silently ignored).
MOE_FIELDS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "n_routed_experts",
                        "n_shared_experts", "routed_scaling_factor", "topk_method", "n_group", "topk_group",
                        "first_k_dense_replace"})
# Latent attention's fields, refused in a family without it.
MLA_FIELDS = frozenset({"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "qk_head_dim"})

# Read by `layer_windows`.
WINDOW_FIELDS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})


def architecture(config: dict[str, Any], where: str) -> Architecture:
    """The family's `Architecture`, after refusing by name every field of `config` the engine does not
    implement (ValueError)."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"{where}: model_type {model_type!r} is not implemented; implemented: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    arch = ARCHITECTURES[model_type]
    for field, value in IMPLEMENTED_VALUES.items():
        if config.get(field, value) != value:
            raise ValueError(f"{where}: {field}={config[field]!r} is not implemented (only {value!r})")
    for fields, present, what in ((MOE_FIELDS, arch.moe, "a mixture of experts"), (MLA_FIELDS, arch.mla,
                                                                                   "latent attention")):
        if not present and fields & set(config):
            raise ValueError(f"{where}: {', '.join(sorted(fields & set(config)))}: {what} is not part of a "
                             f"{model_type!r} model")
    windows = frozenset()
    if arch.window:
        layer_windows(config, arch, where)  # refuses a window setting it cannot state
        windows = WINDOW_FIELDS if arch.reads_layer_types else WINDOW_FIELDS - {"layer_types"}
    unknown = sorted(set(config) - READ_FIELDS - arch.reads - HARMLESS_FIELDS - set(IMPLEMENTED_VALUES)
                     - windows)
    if unknown:
        raise ValueError(f"{where}: config field(s) {', '.join(unknown)} are not implemented by this engine's "
                         f"{model_type!r} model")
    return arch


def layer_windows(config: dict[str, Any], arch: Architecture, where: str) -> list[int | None]:
    """Each layer's sliding window in tokens, or None for full attention, as HF's family derives it.

    The window is `sliding_window` where the family's switch (`use_sliding_window`) is on; a layer applies it
    when `layer_types` says "sliding_attention", or, without `layer_types`, from layer `max_window_layers` on
    (Qwen) or on every layer (Mistral). A window no sequence can cross (at least `max_position_embeddings`) is
    None: such a layer costs nothing over full attention. Bad values raise ValueError naming the field.
    """
    num_layers = config["num_hidden_layers"]
    window = config.get("sliding_window") if arch.window else None
    if arch.window_switch is not None and not config.get(arch.window_switch, False):
        window = None
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"{where}: sliding_window must be a positive integer or null, got {window!r}")
    if window is not None and window >= config.get("max_position_embeddings", 2048):
        window = None
    layer_types = config.get("layer_types") if arch.reads_layer_types else None
    if layer_types is not None:
        other = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if other or len(layer_types) != num_layers:
            raise ValueError(f"{where}: layer_types must list 'full_attention' or 'sliding_attention' for each "
                             f"of the {num_layers} layers, got {layer_types!r}")
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    first = 0
    if window is not None and arch.window_from_layer is not None:
        if not isinstance(config.get(arch.window_from_layer), int):
            raise ValueError(f"{where}: {arch.window_from_layer} (an integer) is needed with sliding_window")
        first = config[arch.window_from_layer]
    return [window if i >= first else None for i in range(num_layers)]


def nope_layers(config: dict[str, Any], arch: Architecture, where: str) -> tuple[int, ...]:
    """The layers that apply no RoPE (SmolLM3's NoPE layers, read as transformers' SmolLM3Config reads them)."""
    if arch.nope_interval is None:
        return ()
    if config.get("use_sliding_window") and config.get("sliding_window") is not None and not config.get("layer_types"):
        raise ValueError(f"{where}: use_sliding_window without layer_types is not implemented (transformers then "
                         "windows the NoPE layers); state layer_types")
    num_layers = config["num_hidden_layers"]
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval", arch.nope_interval)
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"{where}: no_rope_layer_interval must be a positive integer, got {interval!r}")
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if not isinstance(flags, list) or len(flags) != num_layers or any(f not in (0, 1) for f in flags):
        raise ValueError(f"{where}: no_rope_layers must hold one 0 or 1 per layer ({num_layers}), got {flags!r}")
    return tuple(i for i, rotates in enumerate(flags) if not rotates)
