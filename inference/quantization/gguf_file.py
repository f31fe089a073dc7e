"""Read a Llama-family GGUF file's tensors under HF names: Q4_0 / Q4_1 blocks as `Int4Codes` (never via
float), Q8_0 / F16 / F32 as float32 tensors.

GGUF stores a `[N, K]` weight as N rows of 32-input blocks. Q4_1 block: fp16 scale d, fp16 minimum m, then 16
bytes whose low nibbles are inputs 0..15 and high nibbles inputs 16..31, `w = code * d + m`, which is our
`(code - 8) * d + (m + 8d)`; Q4_0 has no m and `w = (code - 8) * d` (zero 0). llama.cpp's converter permutes
the rows of Llama's q and k projections (its RoPE pairs adjacent dims, HF's pairs halves); undoing that is a
row permutation, applied to codes and scales alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from inference.quantization.weights import Int4Codes

# GGUF architecture -> whether llama.cpp permuted q/k rows when converting it.
ARCHITECTURES = {"llama": True, "qwen2": False, "qwen3": False}
FLOAT_TYPES = ("F32", "F16", "Q8_0")
INT4_TYPES = ("Q4_0", "Q4_1")

_TOP_LEVEL = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_IN_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def read_gguf(path: Path, num_layers: int, hidden_size: int, num_heads: int,
              num_kv_heads: int) -> dict[str, torch.Tensor | Int4Codes]:
    """Every tensor of `path` under its HF name (without the "model." prefix), checked against the config."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError, OSError or struct errors on a bad file
        size = path.stat().st_size if path.is_file() else 0
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt ({size} bytes; "
                         f"{type(exc).__name__}: {exc})") from exc
    arch = _field(reader, path, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})")
    expected = {"block_count": num_layers, "embedding_length": hidden_size, "attention.head_count": num_heads,
                "attention.head_count_kv": num_kv_heads}
    for key, want in expected.items():
        got = _field(reader, path, f"{arch}.{key}")
        if got != want:
            raise ValueError(f"{path}: {arch}.{key} is {got}, but the model config says {want}")
    tensors: dict[str, torch.Tensor | Int4Codes] = {}
    for tensor in reader.tensors:
        name = _hf_name(path, tensor.name)
        value = _tensor(path, tensor)
        if ARCHITECTURES[arch] and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if "q_proj" in name else num_kv_heads
            value = _unpermute(value, heads)
        tensors[name] = value
    return tensors


def _field(reader, path: Path, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"{path}: GGUF metadata {key!r} is missing")
    return field.contents()


def _hf_name(path: Path, name: str) -> str:
    stem, _, kind = name.rpartition(".")
    if stem in _TOP_LEVEL:
        return f"{_TOP_LEVEL[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _IN_BLOCK:
        return f"layers.{parts[1]}.{_IN_BLOCK[parts[2]]}.{kind}"
    raise ValueError(f"{path}: tensor {name!r} is not part of a Llama-family model")


def _tensor(path: Path, tensor) -> torch.Tensor | Int4Codes:
    import gguf

    kind = tensor.tensor_type.name
    shape = [int(d) for d in reversed(tensor.shape.tolist())]  # GGUF lists the fastest dimension first
    data = np.asarray(tensor.data)
    if kind in ("F32", "F16"):
        return torch.from_numpy(data.astype(np.float32)).reshape(shape)
    if kind == "Q8_0":
        return torch.from_numpy(gguf.quants.dequantize(data, tensor.tensor_type).astype(np.float32)).reshape(shape)
    if kind in INT4_TYPES:
        if len(shape) != 2:
            raise ValueError(f"{path}: tensor {tensor.name!r} is a {len(shape)}-D {kind} tensor; expected 2-D")
        return _int4_codes(torch.from_numpy(data.copy()), shape, kind == "Q4_1")
    raise ValueError(f"{path}: tensor {tensor.name!r} has type {kind}; supported: {', '.join(FLOAT_TYPES + INT4_TYPES)}")


def _int4_codes(raw: torch.Tensor, shape: list[int], has_min: bool) -> Int4Codes:
    """uint8 `[N, blocks * bytes_per_block]` Q4_0/Q4_1 rows -> codes, scales and zeros."""
    rows, cols = shape
    blocks = raw.view(rows, cols // 32, 20 if has_min else 18)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    qs = blocks[..., 4:20] if has_min else blocks[..., 2:18]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(rows, cols)  # per block: low nibbles, then high
    if has_min:
        zeros = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float() + 8 * d
    else:
        zeros = torch.zeros_like(d)
    return Int4Codes(codes.contiguous(), d, zeros, group_size=32)


def _unpermute(value: torch.Tensor | Int4Codes, heads: int) -> torch.Tensor | Int4Codes:
    """Undo llama.cpp's q/k row permutation (`reshape(heads, 2, d/2).swapaxes(1, 2)`) on every row tensor."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[0]
        return t.reshape(heads, n // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()

    if isinstance(value, Int4Codes):
        return Int4Codes(rows(value.codes), rows(value.scales), rows(value.zeros), value.group_size)
    return rows(value)
