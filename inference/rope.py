"""RoPE's inverse frequencies for each `rope_type` a checkpoint may name, computed as transformers computes them.

A checkpoint states its RoPE in `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (older
files); `rope_parameters` turns either into one dict. `inverse_frequencies` then gives the per-pair
frequencies and the factor HF multiplies cos and sin by (YaRN's attention factor; 1 elsewhere). The tables are
static: every position's angle depends on the position alone, so the K/V already in the paged cache stay
valid as a sequence grows.

Refused by name, because transformers makes their tables depend on the length of the whole sequence at each
forward (`dynamic_rope_update`), which a paged cache holding keys rotated at earlier lengths cannot reproduce
token for token: `dynamic` and `longrope`. `partial_rotary_factor` below 1 is refused too (the rotary kernels
rotate every dimension of a head).
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
    if factor != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={factor} is not implemented (every dimension of a head "
                         "is rotated)")
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


def inverse_frequencies(params: dict[str, Any], head_dim: int,
                        max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """float32 `[head_dim / 2]` inverse frequencies and the factor cos and sin are scaled by."""
    return ROPE_TYPES[params["rope_type"]][2](params, head_dim, max_position_embeddings)


def _plain(params: dict[str, Any], dim: int) -> torch.Tensor:
    return 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    return _plain(params, dim), 1.0


def _linear(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """Positions divided by `factor` (the same as frequencies divided by it)."""
    return _plain(params, dim) / params["factor"], 1.0


def _llama3(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
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


def _yarn(params: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
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


_Compute = Callable[[dict[str, Any], int, int], tuple[torch.Tensor, float]]

# rope_type -> (the keys of its own it needs, those it may read, how its frequencies are computed)
ROPE_TYPES: dict[str, tuple[set[str], set[str], _Compute]] = {
    "default": (set(), set(), _default),
    "linear": ({"factor"}, set(), _linear),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set(), _llama3),
    "yarn": ({"original_max_position_embeddings"},
             {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}, _yarn),
}

_WHY_REFUSED = {
    "dynamic": " (transformers recomputes its table from each forward's sequence length)",
    "longrope": " (transformers switches short/long factors on the whole sequence's length at each forward)",
}
