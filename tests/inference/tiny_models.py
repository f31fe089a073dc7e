"""Tiny random HF models saved to a folder our engine loads (SmolLM2's tokenizer beside them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import PreTrainedModel, PretrainedConfig

from inference.model_loader import DEFAULT_MODEL, TOKENIZER_FILES, resolve_model

SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def save_tiny(folder: Path, model_cls: type[PreTrainedModel], config: PretrainedConfig) -> PreTrainedModel:
    """Build a seeded random model, save it with a tokenizer to `folder`, and return it (float32, eval)."""
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # larger weights than the init, so the argmax is decisive
            param.normal_(0, 0.2)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(resolve_model(DEFAULT_MODEL) / name, folder / name)
    return model
