"""A model's weights as one `name -> tensor` map under HF names (without the "model." prefix), whatever file
they come from: a folder's safetensors (float; or AWQ / GPTQ packs, unpacked to `Int4Codes` under the
layer's `.weight` name) or a GGUF file. `load_model` then only fuses and installs.

With `shards` (tensor parallelism), a safetensors weight is read only in the part this rank keeps; GGUF and
AWQ/GPTQ checkpoints are not sharded (the engine refuses them under tensor parallelism).

A family whose checkpoints fuse projections (Phi-3's `qkv_proj` and `gate_up_proj`, `Architecture.fused_weights`)
has them split here into the Llama names, before sharding, so the loader, tensor parallelism, int8/int4 at load
and LoRA see one layout. Packed AWQ/GPTQ tensors of a fused projection are refused by name (not split).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from inference.parallel.layers import WeightShards
from inference.quantization import QuantizationConfig
from inference.quantization.gguf_file import read_gguf
from inference.quantization.packed_int4 import unpack_awq, unpack_gptq
from inference.quantization.weights import Int4Codes

PACK_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


def read_weights(folder: Path, quant: QuantizationConfig | None, num_layers: int, hidden_size: int,
                 num_heads: int, num_kv_heads: int, shards: WeightShards | None = None,
                 fused: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> dict[str, torch.Tensor | Int4Codes]:
    sharded = shards is not None and shards.size > 1
    if sharded and quant is not None and quant.method in ("gguf", "awq", "gptq"):
        raise ValueError(f"a {quant.method.upper()} checkpoint cannot be sharded over tensor-parallel ranks")
    if fused and quant is not None and quant.method in ("awq", "gptq"):
        raise ValueError(f"{folder}: a {quant.method.upper()} checkpoint of a model with fused "
                         f"{' / '.join(name.split('.')[-1] for name, _ in fused)} weights is not implemented "
                         "(its packed tensors are not split)")
    if quant is not None and quant.method == "gguf":
        return read_gguf(quant.gguf_file, num_layers, hidden_size, num_heads, num_kv_heads)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} holds no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                key = name.removeprefix("model.")
                parts = _split_fused(key, f, name, fused, num_heads, num_kv_heads)
                if parts is None:
                    weights[key] = shards.take(key, f.get_slice(name)) if sharded else f.get_tensor(name)
                    origin[key] = file
                    continue
                for part_key, part in parts.items():
                    weights[part_key] = shards.take(part_key, part) if sharded else part
                    origin[part_key] = file
    if quant is not None and quant.method in ("awq", "gptq"):
        return _unpack(weights, origin, quant)
    return weights


def _split_fused(key: str, file, name: str, fused: tuple[tuple[str, tuple[str, ...]], ...], num_heads: int,
                 num_kv_heads: int) -> dict[str, torch.Tensor] | None:
    """For a fused projection's weight or bias, its parts under their own names: q/k/v split by head counts
    (the rows are heads * head_dim each), the others evenly. None for any other tensor."""
    for module, part_names in fused:
        prefix, dot, suffix = key.partition(f".{module}.")
        if dot and suffix in ("weight", "bias"):
            tensor = file.get_tensor(name)
            units = [{"q_proj": num_heads, "k_proj": num_kv_heads, "v_proj": num_kv_heads}.get(p, 1)
                     for p in part_names]
            if tensor.shape[0] % sum(units):
                raise ValueError(f"{name}: {tensor.shape[0]} rows do not split into {', '.join(part_names)}")
            row = tensor.shape[0] // sum(units)
            pieces = tensor.split([u * row for u in units])
            sub = module.rpartition(".")[0]
            return {f"{prefix}.{sub}.{p}.{suffix}": piece.contiguous() for p, piece in zip(part_names, pieces)}
    return None


def _unpack(weights: dict[str, torch.Tensor], origin: dict[str, Path],
            quant: QuantizationConfig) -> dict[str, torch.Tensor | Int4Codes]:
    """Replace each layer's qweight/qzeros/scales(/g_idx) by its `Int4Codes` under `<layer>.weight`."""
    out: dict[str, torch.Tensor | Int4Codes] = {}
    layers = [name.removesuffix(".qweight") for name in weights if name.endswith(".qweight")]
    for layer in layers:
        where = f"{origin[layer + '.qweight']}: tensor {layer + '.qweight'!r}"
        missing = [s for s in ("qzeros", "scales") if f"{layer}.{s}" not in weights]
        if missing:
            raise ValueError(f"{where}: its {', '.join(missing)} is missing")
        pack = {s: weights.pop(f"{layer}.{s}") for s in PACK_SUFFIXES if f"{layer}.{s}" in weights}
        try:
            if quant.method == "awq":
                codes = unpack_awq(pack["qweight"], pack["qzeros"], pack["scales"], quant.group_size)
            else:
                codes = unpack_gptq(pack["qweight"], pack["qzeros"], pack["scales"], pack.get("g_idx"),
                                    quant.group_size, quant.zero_offset)
        except ValueError as exc:
            raise ValueError(f"{where} ({quant.method.upper()}, group size {quant.group_size}): {exc}") from None
        out[layer + ".weight"] = codes
    if not layers:
        raise ValueError(f"{next(iter(origin.values()))}: a {quant.method.upper()} checkpoint without any "
                         "packed (qweight) tensor")
    return {**weights, **out}
