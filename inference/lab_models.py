"""The lab's three tiny attention variants: multi-head (MHA), grouped-query (GQA) and multi-head latent
attention (MLA), for the scenario that fills the same KV pool bytes with each (inference/lab_scenarios.py).

Each is a seeded random model built from transformers' own config class (LlamaConfig with 8 or 2 KV heads,
DeepseekV2Config with a latent cache), saved once with SmolLM2's tokenizer under the model cache
(`cache_dir()/lab-models/<name>-<digest of its shape>`) and loaded from there after: nothing is downloaded.
Random weights are enough because the scenario is about memory (bytes per token, blocks, admissions), not
about what the text says; the page says so.

The three have the same width: hidden size 128, 8 query heads of 16 dimensions, 2 layers, the same MLP. Only
what a token leaves in the cache differs: MHA a key and a value per query head, GQA per group of 4 query
heads, MLA one 24-value latent plus one 8-value RoPE key shared by all heads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inference.config import EngineArgs
from inference.engine import LLMEngine
from inference.model import ModelConfig
from inference.model_loader import DEFAULT_MODEL, TOKENIZER_FILES, build_folder, cache_dir, resolve_model

WIDTH = {"vocab_size": 49152, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 8, "max_position_embeddings": 512, "tie_word_embeddings": True}
SEED = 0


@dataclass(frozen=True)
class LabModel:
    name: str
    title: str
    family: str  # "llama" or "deepseek_v2": which transformers classes build it
    shape: dict[str, Any]  # the config's fields beyond WIDTH

    @property
    def digest(self) -> str:
        """Names the build: a change of shape or seed builds a new folder instead of reusing a stale one."""
        spec = json.dumps({"family": self.family, "width": WIDTH, "shape": self.shape, "seed": SEED}, sort_keys=True)
        return hashlib.sha256(spec.encode()).hexdigest()[:12]


LAB_MODELS: dict[str, LabModel] = {m.name: m for m in (
    LabModel("mha", "Multi-head attention (MHA)", "llama", {"num_key_value_heads": 8, "head_dim": 16}),
    LabModel("gqa", "Grouped-query attention (GQA)", "llama", {"num_key_value_heads": 2, "head_dim": 16}),
    # Every layer dense (first_k_dense_replace = layers): the MLP is the other two's, only attention differs.
    LabModel("mla", "Multi-head latent attention (MLA)", "deepseek_v2", {
        "num_key_value_heads": 8, "kv_lora_rank": 24, "q_lora_rank": None, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": WIDTH["num_hidden_layers"]}),
)}


def lab_model_folder(name: str) -> Path:
    """The model's folder under the cache, built on first use (a second or so; a temporary sibling renamed
    into place, so a crash or a concurrent worker never sees half a model)."""
    try:
        model = LAB_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown lab model {name!r}; one of {sorted(LAB_MODELS)}") from None
    target = cache_dir() / "lab-models" / f"{name}-{model.digest}"
    if (target / "config.json").is_file():
        return target
    return build_folder(target, lambda folder: _build(model, folder))


def _build(model: LabModel, folder: Path) -> None:
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, LlamaConfig, LlamaForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                             "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM)}[model.family]
    torch.manual_seed(SEED)
    hf = model_cls(config_cls(**WIDTH, **model.shape)).eval()
    hf.save_pretrained(folder)
    tokenizer = resolve_model(DEFAULT_MODEL)
    for file in TOKENIZER_FILES:
        shutil.copy(tokenizer / file, folder / file)


@functools.cache
def lab_model_engine(name: str) -> LLMEngine:
    """An engine holding the model's weights (float32, CPU) for the lab's sandboxes to share: loaded once per
    process, its own pool one block (nothing runs on it). The torch reference backend, which its sandboxes
    follow: a GPU worker may never have built the C++ CPU kernels, and building them (minutes) would stall its
    engine loop, where the lab runs; a model this small needs no fast kernel."""
    return LLMEngine(EngineArgs(model=str(lab_model_folder(name)), device="cpu", dtype="float32", block_size=8,
                                num_kv_blocks=1, max_model_len=8, attention_backend="torch"))


def kv_arithmetic(cfg: ModelConfig, dtype: torch.dtype) -> str:
    """How one token's cache bytes add up for a loaded model, as the page states them (the product is the
    engine's kv_bytes_per_token)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    tail = f"{cfg.num_layers} layers × {itemsize} bytes"
    if cfg.mla:
        return f"({cfg.mla.kv_lora_rank} latent + {cfg.mla.qk_rope_head_dim} RoPE key) × {tail}"
    return f"K and V: 2 × {cfg.num_kv_heads} KV heads × {cfg.head_dim} dims × {tail}"
