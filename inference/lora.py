"""LoRA adapters: what a request names (`LoRARequest`) and the host-side weights loaded from a PEFT folder.

An adapter folder is what `peft` saves: `adapter_config.json` (r, lora_alpha, target_modules among
q/k/v/o/gate/up/down_proj, use_rslora) and `adapter_model.safetensors` (one `lora_A` `[r, in]` and `lora_B`
`[out, r]` per adapted projection of each decoder layer). `load_adapter` checks everything against the
model before any of it is used, so a bad adapter is one clear `LoRAError` (a `ValueError`) for the request
that named it, and nothing else.

An adapter's *digest* is a sha256 of its scaled weights, not of its name: it is the adapter's identity in
the prefix cache (the first block's extra keys) and in the device slots (`inference.lora_slots`), so two
names for the same weights share, and the same name with new weights does not.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from inference.model import ModelConfig

# A PEFT target module -> (decoder sub-layer, our Linear that holds it, its part of a fused output).
TARGET_MODULES: dict[str, tuple[str, str, int]] = {
    "q_proj": ("self_attn", "qkv_proj", 0),
    "k_proj": ("self_attn", "qkv_proj", 1),
    "v_proj": ("self_attn", "qkv_proj", 2),
    "o_proj": ("self_attn", "o_proj", 0),
    "gate_proj": ("mlp", "gate_up_proj", 0),
    "up_proj": ("mlp", "gate_up_proj", 1),
    "down_proj": ("mlp", "down_proj", 0),
}
_WEIGHT_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# adapter_config.json options this engine cannot serve when they are set (PEFT saves them false or empty).
_UNSUPPORTED = ("use_dora", "fan_in_fan_out", "modules_to_save", "layers_to_transform", "layer_replication",
                "rank_pattern", "alpha_pattern", "lora_bias", "target_parameters", "trainable_token_indices")


class LoRAError(ValueError):
    """A LoRA request or adapter the engine cannot serve; the message says which and why."""


@dataclass(frozen=True)
class LoRARequest:
    """An adapter for a request, as in vLLM: a name, a unique positive integer id, a PEFT folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise LoRAError("lora_name must be a non-empty string")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise LoRAError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, (str, Path)):
            raise LoRAError(f"lora_path must be a path, got {type(self.lora_path).__name__}")


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection an adapter may target."""
    q, kv, h, m = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter's weights on the host, float32: per (layer, module), A `[r, in]` and B `[out, r]` with the
    scaling (lora_alpha / r, or / sqrt(r) with rsLoRA) already folded into B."""

    name: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    digest: str


def load_adapter(request: LoRARequest, cfg: ModelConfig, max_rank: int) -> LoRAAdapter:
    """Read and check a PEFT adapter folder against the model; raises LoRAError naming the problem."""
    folder = Path(request.lora_path).expanduser()
    where = f"LoRA adapter {request.lora_name!r} ({folder})"
    if not folder.is_dir():
        raise LoRAError(f"{where}: no such adapter folder")
    config = _read_config(folder, where)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAError(f"{where}: adapter_config.json needs an integer r >= 1, got {rank!r}")
    if rank > max_rank:
        raise LoRAError(f"{where}: rank {rank} is above max_lora_rank={max_rank}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoRAError(f"{where}: adapter_config.json needs a numeric lora_alpha, got {alpha!r}")
    targets = _targets(config.get("target_modules"), where)
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)

    shapes = module_shapes(cfg)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in _read_tensors(folder, where).items():
        match = _WEIGHT_NAME.search(name)
        if match is None or match.group(2) not in TARGET_MODULES:
            raise LoRAError(f"{where}: weight {name!r} is not a lora_A/lora_B of a q/k/v/o/gate/up/down projection")
        layer, module, kind = int(match.group(1)), match.group(2), match.group(3)
        if module not in targets:
            raise LoRAError(f"{where}: weight {name!r} is for {module}, which target_modules does not list")
        if layer >= cfg.num_layers:
            raise LoRAError(f"{where}: weight {name!r} is for layer {layer}; the model has {cfg.num_layers}")
        in_features, out_features = shapes[module]
        want = (rank, in_features) if kind == "A" else (out_features, rank)
        if tuple(tensor.shape) != want:
            raise LoRAError(f"{where}: {name} has shape {tuple(tensor.shape)}, expected {want} for this model")
        pairs.setdefault((layer, module), {})[kind] = tensor.float()
    if not pairs:
        raise LoRAError(f"{where}: adapter_model.safetensors holds no LoRA weights")
    weights = {}
    for key, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise LoRAError(f"{where}: layer {key[0]} {key[1]} has lora_{''.join(pair)} but not both A and B")
        weights[key] = (pair["A"].contiguous(), (pair["B"] * scaling).contiguous())
    return LoRAAdapter(request.lora_name, rank, weights, _digest(weights))


def _read_config(folder: Path, where: str) -> dict:
    path = folder / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoRAError(f"{where}: adapter_config.json is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRAError(f"{where}: adapter_config.json is unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise LoRAError(f"{where}: adapter_config.json is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"{where}: peft_type is {config['peft_type']!r}, only LORA adapters are served")
    for option in _UNSUPPORTED:
        if config.get(option):
            raise LoRAError(f"{where}: {option}={config[option]!r} is not supported")
    if config.get("bias", "none") != "none":
        raise LoRAError(f"{where}: bias={config['bias']!r} is not supported (only 'none')")
    return config


def _targets(value: object, where: str) -> set[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise LoRAError(f"{where}: target_modules must be a non-empty list of module names, got {value!r}")
    unknown = sorted(set(names) - set(TARGET_MODULES))
    if unknown:
        raise LoRAError(f"{where}: target module(s) {', '.join(unknown)} are not in this model "
                        f"(LoRA can adapt {', '.join(TARGET_MODULES)})")
    return set(names)


def _read_tensors(folder: Path, where: str) -> dict[str, torch.Tensor]:
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise LoRAError(f"{where}: adapter_model.safetensors is missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoRAError(f"{where}: adapter_model.safetensors is corrupt ({exc})") from None


def _digest(weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for (layer, module), (a, b) in weights.items():
        h.update(f"{layer}.{module}:{tuple(a.shape)}".encode())
        h.update(a.numpy().tobytes())
        h.update(b.numpy().tobytes())
    return h.hexdigest()
