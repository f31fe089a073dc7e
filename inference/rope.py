"""RoPE's inverse frequencies for each `rope_type` a checkpoint may name, computed as transformers computes them.

A checkpoint states its RoPE in `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (older
files); `rope_parameters` turns either into one dict. `inverse_frequencies` then gives the per-pair
frequencies and the factor HF multiplies cos and sin by (YaRN's and LongRoPE's attention factor; 1 elsewhere).
With `partial_rotary_factor` < 1 (Phi-4-mini's 0.75) only the first `rotary_dim` dimensions of each head are
rotated, and the tables cover those alone (the rotary kernels leave the rest of the head as it is).

The tables are static: every position's angle depends on the position alone, so the K/V already in the paged
cache stay valid as a sequence grows. `longrope` (Phi-3) is the one type whose HF table depends on a length:
transformers uses `short_factor` while a forward's sequence (the largest position + 1) is at most
`original_max_position_embeddings` and `long_factor` past it, and keeps the keys it cached under the other
factor. A paged cache fixes one table per engine, as vLLM does: the table HF computes for a sequence of
`max_model_len` tokens (short where `max_model_len <= original_max_position_embeddings`, long beyond). It
equals HF token for token whenever `max_model_len <= original_max_position_embeddings`, and beyond that for
every sequence whose prompt is longer than `original_max_position_embeddings` (HF then uses the long factor
at every forward); a shorter prompt under a longer `max_model_len` differs from HF, which starts it short.
With `max_model_len` unset the table is chosen for `max_position_embeddings` (vLLM derives max_model_len from
it) even where the engine then shrinks max_model_len to a smaller KV pool: set `max_model_len` to choose.

Refused by name: `dynamic` (transformers recomputes its table from the whole sequence's length at each
forward, which a paged cache holding keys rotated at earlier lengths cannot reproduce token for token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

# Keys a rope dict may hold besides these per-type ones: what every type reads, and the old spelling of the type.
COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def rope_parameters(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The checkpoint's RoPE as one dict holding `rope_type` and `rope_theta` (and the type's own keys)."""
    given = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{where}: rope_parameters must be an object, got {given!r}")
    params = dict(given)
    params["rope_type"] = params.pop("type", None) or params.get("rope_type") or "default"
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    if factor != 1.0:
        params["partial_rotary_factor"] = factor
    if params["rope_type"] in ORIGINAL_LENGTH_TYPES and "original_max_position_embeddings" in config:
        # HF gives a top-level original_max_position_embeddings (Phi-3's) priority over the rope dict's.
        params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    if params["rope_type"] not in ROPE_TYPES:
        raise ValueError(f"{where}: rope_type {params['rope_type']!r} is not implemented; implemented: "
                         f"{', '.join(ROPE_TYPES)}" + _WHY_REFUSED.get(params["rope_type"], ""))
    required, optional, _ = ROPE_TYPES[params["rope_type"]]
    missing = sorted(required - set(params))
    if missing:
        raise ValueError(f"{where}: rope_type {params['rope_type']!r} needs {', '.join(missing)}")
    unknown = sorted(set(params) - COMMON_KEYS - required - optional)
    if unknown:
        raise ValueError(f"{where}: rope_type {params['rope_type']!r} does not implement {', '.join(unknown)}")
    return params


def rotary_dim(params: dict[str, Any], head_dim: int) -> int:
    """How many leading dimensions of each head RoPE rotates (all but with `partial_rotary_factor` < 1)."""
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if dim < 2 or dim % 2:
        raise ValueError(f"partial_rotary_factor={params.get('partial_rotary_factor')} of head_dim {head_dim} "
                         f"rotates {dim} dimensions; the rotary kernels need an even number >= 2")
    return dim


def inverse_frequencies(params: dict[str, Any], head_dim: int, max_position_embeddings: int,
                        max_model_len: int | None = None) -> tuple[torch.Tensor, float]:
    """float32 `[rotary_dim / 2]` inverse frequencies and the factor cos and sin are scaled by: HF's table for a
    sequence of `max_model_len` tokens (only `longrope`'s depends on it; None reads as max_position_embeddings)."""
    seq_len = max_position_embeddings if max_model_len is None else max_model_len
    return ROPE_TYPES[params["rope_type"]][2](params, rotary_dim(params, head_dim), max_position_embeddings,
                                              seq_len)


def _plain(params: dict[str, Any], dim: int) -> torch.Tensor:
    return 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default(params: dict[str, Any], dim: int, max_positions: int,
             seq_len: int) -> tuple[torch.Tensor, float]:
    return _plain(params, dim), 1.0


def _linear(params: dict[str, Any], dim: int, max_positions: int,
            seq_len: int) -> tuple[torch.Tensor, float]:
    """Positions divided by `factor` (the same as frequencies divided by it)."""
    return _plain(params, dim) / params["factor"], 1.0


def _llama3(params: dict[str, Any], dim: int, max_positions: int,
            seq_len: int) -> tuple[torch.Tensor, float]:
    """Llama 3.1's: long wavelengths divided by `factor`, short ones kept, the band between blended."""
    inv_freq = _plain(params, dim)
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
    return torch.where(medium, blended, scaled), 1.0


def _yarn(params: dict[str, Any], dim: int, max_positions: int,
          seq_len: int) -> tuple[torch.Tensor, float]:
    """YaRN: frequencies interpolated by `factor` below a ramp of dimensions, kept above it; cos and sin scaled
    by the attention factor (`0.1 ln(factor) + 1` unless the checkpoint gives it or mscale pairs)."""
    base, original = params["rope_theta"], params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
    return inv_freq, attention


def _longrope(params: dict[str, Any], dim: int, max_positions: int, seq_len: int) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: each frequency divided by its `short_factor` entry, or its `long_factor` entry for a
    sequence longer than `original_max_position_embeddings`; cos and sin scaled by
    `sqrt(1 + ln(factor) / ln(original))` (factor: the checkpoint's, else max_position_embeddings / original)."""
    original = params["original_max_position_embeddings"]
    ext = params["long_factor"] if seq_len > original else params["short_factor"]
    if len(ext) != dim // 2:
        raise ValueError(f"rope_type 'longrope': short_factor and long_factor need {dim // 2} entries (one per "
                         f"rotated pair), got {len(ext)}")
    factor = params.get("factor") or max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * params["rope_theta"] ** shape), attention


_Compute = Callable[[dict[str, Any], int, int, int], tuple[torch.Tensor, float]]

# rope_type -> (the keys of its own it needs, those it may read, how its frequencies are computed)
ROPE_TYPES: dict[str, tuple[set[str], set[str], _Compute]] = {
    "default": (set(), set(), _default),
    "linear": ({"factor"}, set(), _linear),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set(), _llama3),
    "yarn": ({"original_max_position_embeddings"},
             {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}, _yarn),
    "longrope": ({"original_max_position_embeddings", "short_factor", "long_factor"}, {"factor", "attention_factor"},
                 _longrope),
}
# Types that read `original_max_position_embeddings` (a top-level one, Phi-3's, takes priority as in HF).
ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")

_WHY_REFUSED = {
    "dynamic": " (transformers recomputes its table from each forward's sequence length)",
}
