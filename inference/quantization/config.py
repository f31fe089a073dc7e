"""Which quantization method a model runs with, checked against its checkpoint and device, and what each
method makes of every weight.

Methods (vLLM's names): None (float weights, the default and the oracle path); "int8" (per-row int8, quantized
at load) and "int4" (group-wise int4, quantized at load) for any float checkpoint; "gguf" (the file's own Q4_0 /
Q4_1 blocks as int4); "awq" and "gptq" (the packed int4 checkpoints those tools write).

When `quantization` is not given it is read from the checkpoint: `quantization_config.quant_method` in
config.json, or a folder whose only weights are a `.gguf` file. A method that does not match the checkpoint
is a ValueError, never a silent fall-back to float.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.linear import FloatWeight, LinearWeight
from inference.quantization.weights import Int4Codes, Int4Weight, Int8Weight, quantize_int4

METHODS = (None, "int8", "int4", "gguf", "awq", "gptq")
PACKED_METHODS = ("awq", "gptq")  # checkpoints that say so in config.json's quantization_config


@dataclass(frozen=True)
class QuantizationConfig:
    """A resolved method. `group_size`: int4 groups (at load, or the checkpoint's); `gguf_file`: for "gguf".

    For GPTQ, `zero_offset` is 1 for the v1 checkpoint format (zeros stored minus one) and 0 for v2.
    """

    method: str
    group_size: int = 32
    gguf_file: Path | None = None
    zero_offset: int = 0


def linear_weight(quant: QuantizationConfig | None, parts: list[torch.Tensor | Int4Codes], embedding: bool,
                  device: torch.device, dtype: torch.dtype) -> LinearWeight:
    """The weight fused from `parts` (output order), stored the way `quant` stores that kind of layer.

    Packed int4 parts (GGUF, AWQ, GPTQ) keep their codes. Float parts stay float without a method; "int8"
    and "int4" quantize them ("int4" keeps the embedding / tied lm_head table in int8: it is also a row
    lookup). "gguf" keeps a Q8_0 embedding (SmolLM2's) exactly as the file's blocks for float32 activations, so
    that path equals HF on the file's de-quantized weights; for 16-bit activations it re-quantizes the table
    to per-row int8, which the fast kernels take (they take no 32-wide blocks). The float tensors of an AWQ/GPTQ checkpoint (embedding, lm_head) stay
    float, as those tools ship them.
    """
    method = None if quant is None else quant.method
    if all(isinstance(p, Int4Codes) for p in parts):
        if method is None:
            raise ValueError("the checkpoint holds int4 weights but no quantization method was chosen")
        if embedding:
            raise ValueError("an int4 embedding table is not supported (only linear layers may be int4)")
        return Int4Weight(Int4Codes.cat(parts), device, dtype)
    if any(isinstance(p, Int4Codes) for p in parts):
        raise ValueError("a fused layer mixes int4 and float parts")
    weight = torch.cat(parts)
    if embedding and method == "gguf" and dtype == torch.float32:
        exact = Int8Weight.from_q8_0_values(weight, device)
        return exact if exact is not None else FloatWeight(weight.to(device))
    if method == "int8" or (embedding and method in ("int4", "gguf")):
        return Int8Weight.quantize(weight, device, dtype)
    if method == "int4":
        return Int4Weight(quantize_int4(weight, quant.group_size), device, dtype)
    return FloatWeight(weight.to(device))


def resolve_quantization(requested: str | None, folder: Path, gguf_file: Path | None, device: torch.device,
                         group_size: int = 32) -> QuantizationConfig | None:
    """Check `requested` against the checkpoint (`folder`, and `gguf_file` when one is available) and device.

    Returns None for float weights. `group_size` applies to "int4" at load; packed checkpoints carry theirs.
    """
    if requested not in METHODS:
        raise ValueError(f"quantization must be one of {', '.join(map(repr, METHODS))}; got {requested!r}")
    stored = _checkpoint_config(folder)
    stored_method = None if stored is None else str(stored.get("quant_method", "")).lower()
    if stored is not None and stored_method not in PACKED_METHODS:
        raise ValueError(f"{folder}/config.json: quantization method {stored_method!r} is not supported "
                         f"(supported checkpoints: {', '.join(PACKED_METHODS)})")
    only_gguf = gguf_file is not None and not any(folder.glob("*.safetensors"))
    method = requested or stored_method or ("gguf" if only_gguf else None)
    if method is None:
        return None
    if stored_method is not None and method != stored_method:
        raise ValueError(f"{folder} is a {stored_method!r} checkpoint; quantization={method!r} does not match "
                         f"(pass quantization={stored_method!r} or leave it unset)")
    _check_device(method, device)
    if method in ("int8", "int4") and only_gguf:
        raise ValueError(f"{folder} holds only a GGUF file; use quantization='gguf' for it")
    if method == "int4":
        if group_size not in (32, 64):
            raise ValueError(f"int4 quantization at load takes group size 32 or 64, got {group_size}")
        return QuantizationConfig("int4", group_size=group_size)
    if method == "int8":
        return QuantizationConfig("int8")
    if method == "gguf":
        if gguf_file is None:
            raise ValueError(f"quantization='gguf' needs a .gguf file; {folder} has none")
        return QuantizationConfig("gguf", group_size=32, gguf_file=gguf_file)
    return _packed_config(method, stored, folder)


def _checkpoint_config(folder: Path) -> dict | None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        return None
    stored = json.loads(config_file.read_text()).get("quantization_config")
    return stored or None


def _packed_config(method: str, stored: dict | None, folder: Path) -> QuantizationConfig:
    where = f"{folder}/config.json quantization_config"
    if stored is None:
        raise ValueError(f"quantization={method!r} needs a {method.upper()} checkpoint; {folder}/config.json "
                         "has no quantization_config (for a float checkpoint use 'int4' or 'int8')")
    bits = stored.get("bits", stored.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{where}: only 4-bit {method.upper()} is supported, got bits={bits!r}")
    group_size = stored.get("group_size", stored.get("q_group_size"))
    if not isinstance(group_size, int) or group_size not in (32, 64, 128, 256):
        raise ValueError(f"{where}: group_size must be 32, 64, 128 or 256, got {group_size!r}")
    if method == "awq":
        version = str(stored.get("version", "gemm")).lower()
        if version != "gemm" or stored.get("zero_point", True) is not True:
            raise ValueError(f"{where}: only AWQ 'gemm' with zero points is supported, got version={version!r}")
        return QuantizationConfig("awq", group_size=group_size)
    fmt = str(stored.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"{where}: checkpoint_format {fmt!r} is not supported (gptq or gptq_v2)")
    return QuantizationConfig("gptq", group_size=group_size, zero_offset=1 if fmt == "gptq" else 0)


def _check_device(method: str, device: torch.device) -> None:
    """Every method needs a kernel here: torch's on CPU, Triton's int4 on CUDA."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"quantization={method!r} has no kernel on device {device.type!r} (only cpu and cuda)")
    if device.type == "cuda" and method != "int8":
        try:
            import kernels.int4_triton  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"quantization={method!r} on CUDA needs Triton's int4 kernel: {exc}") from exc
