"""Quantized checkpoints built on the fly for the quantization tests, and HF models holding our engine's weights.

No small AWQ / GPTQ checkpoint ships offline, so `pack_awq` and `pack_gptq` write those layouts themselves,
from the published formats (see `inference.quantization.packed_int4` for the layouts). GGUF files are
written with the `gguf` package's own writer and quantizers, with llama.cpp's q/k row permutation applied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PretrainedConfig, PreTrainedModel

from inference.model_loader import DEFAULT_MODEL, TOKENIZER_FILES, resolve_model
from inference.moe import SparseMoE
from inference.quantization.packed_int4 import AWQ_ORDER

TINY = dict(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama(config_cls: type[PretrainedConfig] = LlamaConfig, **overrides) -> PreTrainedModel:
    """A random Llama (or another family's model, from `config_cls`) with weights large enough that its greedy
    argmax is decisive."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_cls(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model


def save_folder(folder: Path, model: LlamaForCausalLM, tensors: dict[str, torch.Tensor] | None = None,
                quantization_config: dict | None = None) -> Path:
    """An HF folder: config.json (+ quantization_config), the default model's tokenizer, and `tensors`
    (the model's own float state dict when None)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    state = tensors if tensors is not None else {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    for name in TOKENIZER_FILES:
        shutil.copy(resolve_model(DEFAULT_MODEL) / name, folder / name)
    return folder


def quantize_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 of a `[K, N]` (input-major) weight per group of inputs: codes, zeros, scales."""
    k, n = w.shape
    g = w.view(k // group, group, n)
    low, high = g.amin(1), g.amax(1)
    scales = (high - low) / 15
    zeros = (-low / scales).round().clamp(0, 15)
    codes = (g / scales.unsqueeze(1) + zeros.unsqueeze(1)).round().clamp(0, 15)
    return codes.view(k, n).int(), zeros.int(), scales.half()


def pack_nibbles(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """Eight 4-bit values along `dim` into one int32; nibble i takes element order[i] of each eight."""
    moved = values.movedim(dim, -1)
    eights = moved.reshape(*moved.shape[:-1], -1, 8).to(torch.int64)
    packed = torch.zeros(eights.shape[:-1], dtype=torch.int64)
    for i, j in enumerate(order):
        packed |= eights[..., j] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # reinterpret as signed int32
    return packed.to(torch.int32).movedim(-1, dim).contiguous()


def pack_awq(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """An `[N, K]` float weight in AutoAWQ's GEMM layout: qweight/qzeros packed along outputs, interleaved."""
    codes, zeros, scales = quantize_groups(w.t(), group)
    return {"qweight": pack_nibbles(codes, 1, AWQ_ORDER), "qzeros": pack_nibbles(zeros, 1, AWQ_ORDER),
            "scales": scales}


def pack_gptq(w: torch.Tensor, group: int, act_order: torch.Tensor | None, v1: bool) -> dict[str, torch.Tensor]:
    """An `[N, K]` float weight in GPTQ's layout: qweight packed along inputs, g_idx per input.

    `act_order` (a permutation of the inputs) makes groups of inputs in that order, as desc_act does;
    v1 stores every zero minus one.
    """
    wt = w.t()  # [K, N]
    k = wt.shape[0]
    perm = torch.arange(k) if act_order is None else act_order
    codes_perm, zeros, scales = quantize_groups(wt[perm], group)
    codes = torch.empty_like(codes_perm)
    codes[perm] = codes_perm
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).int()
    stored_zeros = zeros - 1 if v1 else zeros
    return {"qweight": pack_nibbles(codes, 0), "qzeros": pack_nibbles(stored_zeros & 0xF, 1), "scales": scales,
            "g_idx": g_idx}


def packed_checkpoint(model: LlamaForCausalLM, pack) -> dict[str, torch.Tensor]:
    """The model's state dict with every linear layer (not lm_head) replaced by `pack(weight)`'s tensors."""
    state = {}
    for name, value in model.state_dict().items():
        layer = name.removesuffix(".weight")
        if name.endswith(".weight") and layer.rsplit(".", 1)[-1] in LINEAR:
            state.update({f"{layer}.{key}": t for key, t in pack(value).items()})
        else:
            state[name] = value.contiguous()
    return state


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> interleaved RoPE pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model: LlamaForCausalLM, linear_type: gguf.GGMLQuantizationType,
               embed_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q8_0,
               arch: str = "llama") -> Path:
    """The model as a GGUF file the way llama.cpp's converter lays it out (names, metadata, and for `llama`
    the q/k row permutation; its Qwen converters do not permute)."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_context_length(cfg.max_position_embeddings)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}
    block = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    for name, value in model.state_dict().items():
        stem, kind = name.removeprefix("model.").rsplit(".", 1)
        if stem.startswith("layers."):
            _, i, rest = stem.split(".", 2)
            gguf_name = f"blk.{i}.{block[rest]}.{kind}"
        else:
            gguf_name = f"{names[stem]}.{kind}"
        data = value.float().numpy()
        if arch == "llama" and stem.endswith("self_attn.q_proj"):
            data = llama_cpp_permute(data, cfg.num_attention_heads)
        elif arch == "llama" and stem.endswith("self_attn.k_proj"):
            data = llama_cpp_permute(data, cfg.num_key_value_heads)
        qtype = gguf.GGMLQuantizationType.F32 if data.ndim == 1 else (
            embed_type if stem in ("embed_tokens", "lm_head") else linear_type)
        if qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        elif qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, data)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_with_engine_weights(llm, hf_config) -> PreTrainedModel:
    """An HF model of `hf_config`'s family holding exactly the weight values our engine multiplies by (its
    quantized weights de-quantized): HF's greedy on it is the oracle for a quantized engine. A mixture-of-experts
    layer (Qwen3-MoE, Mixtral) gives its router and stacked experts, in HF's fused `experts.*_proj` layout."""
    model = llm.llm_engine.runner.model
    cfg = model.cfg
    config = type(hf_config)(**{**hf_config.to_dict(), "tie_word_embeddings": False})
    hf = AutoModelForCausalLM.from_config(config).eval()
    state = {"model.embed_tokens.weight": model.embed_tokens.weight.dequantize(),
             "model.norm.weight": model.norm.weight.float(), "lm_head.weight": model.lm_head.weight.dequantize()}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.self_attn.qkv_proj.weight.dequantize().split(layer.self_attn.qkv_proj.output_sizes)
        if isinstance(layer.mlp, SparseMoE):
            gate_up, down = layer.mlp.expert_weights()
            state.update({p + "mlp.gate.weight": layer.mlp.gate.float(), p + "mlp.experts.gate_up_proj": gate_up,
                          p + "mlp.experts.down_proj": down})
        else:
            gate, up = layer.mlp.gate_up_proj.weight.dequantize().split(layer.mlp.gate_up_proj.output_sizes)
            state.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                          p + "mlp.down_proj.weight": layer.mlp.down_proj.weight.dequantize()})
        state.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                      p + "self_attn.v_proj.weight": v,
                      p + "self_attn.o_proj.weight": layer.self_attn.o_proj.weight.dequantize(),
                      p + "input_layernorm.weight": layer.input_layernorm.weight.float(),
                      p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight.float()})
        if layer.self_attn.qk_norm is not None:
            q_norm, k_norm = layer.self_attn.qk_norm
            state.update({p + "self_attn.q_norm.weight": q_norm.weight.float(),
                          p + "self_attn.k_norm.weight": k_norm.weight.float()})
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    assert cfg.num_layers == config.num_hidden_layers
    return hf


def hf_greedy(hf: LlamaForCausalLM, ids: list[int], max_new_tokens: int) -> list[int]:
    """HF's greedy continuation, exactly `max_new_tokens` long with EOS a token like any other (our engine's
    ignore_eos); `generate(min_new_tokens=...)` would forbid EOS instead."""
    tokens: list[int] = []
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        for _ in range(max_new_tokens):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = hf(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens
