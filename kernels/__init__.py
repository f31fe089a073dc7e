"""Paged-attention ops with a backend chosen by device.

``kernels.<op>(...)`` runs the Triton kernel (``kernels.triton_kernels``) when its tensors live on CUDA and the
C++ CPU kernels (``kernels.cpu_kernels``) otherwise, or the pure-torch reference (``kernels.reference``, the
oracle every backend is tested against) where the C++ kernels cannot be built. ``get_backend`` lets the
engine force one backend: ``"triton"`` also works on CPU tensors when ``TRITON_INTERPRET=1`` is set before
triton is imported. Triton is imported lazily, so ``import kernels`` works where triton is not installed.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType

import torch
from torch import Tensor

from kernels import cpu_kernels, moe_reference, reference

__all__ = ["reshape_and_cache", "paged_attention_decode", "paged_attention_prefill", "copy_blocks",
           "rotary_embedding_", "rms_norm", "silu_and_mul", "gelu_tanh_and_mul", "fused_moe", "fused_moe_for",
           "get_backend", "BACKENDS"]

BACKENDS = (None, "auto", "triton", "cpu", "torch")


def get_backend(name: str | None, device: torch.device | str) -> ModuleType:
    """The module implementing the ops for ``name`` (None/"auto", "triton", "cpu" or "torch") on ``device``.

    "auto" picks Triton on CUDA; on the CPU the C++ kernels, or the torch reference with a warning saying why
    when they cannot be built (no compiler, say). Raises ValueError for an unknown name, for "cpu" off the CPU
    or when it cannot be built, and for "triton" on a non-CUDA device without ``TRITON_INTERPRET=1``.
    """
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of None, 'auto', 'triton', 'cpu', 'torch'; got {name!r}")
    device = torch.device(device)
    if name == "torch":
        return reference
    if name == "cpu" or (name in (None, "auto") and device.type == "cpu"):
        return _cpu(device, required=name == "cpu")
    if name in (None, "auto") and device.type != "cuda":
        return reference
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"the triton backend needs a CUDA device or TRITON_INTERPRET=1 (device is {device})")
    return _triton()


def _triton() -> ModuleType:
    try:
        return importlib.import_module("kernels.triton_kernels")
    except ImportError as exc:
        raise ValueError(f"the triton backend is unavailable: {exc}") from exc


def _cpu(device: torch.device, required: bool) -> ModuleType:
    if device.type != "cpu":
        raise ValueError(f"the cpu backend runs on the CPU only (device is {device})")
    if cpu_kernels.available():
        return cpu_kernels
    if required:
        raise ValueError(f"the cpu backend is unavailable: {cpu_kernels.unavailable_reason()}")
    warnings.warn(f"C++ CPU kernels unavailable, using the (slower) torch reference: "
                  f"{cpu_kernels.unavailable_reason()}", RuntimeWarning, stacklevel=3)
    return reference


def _for(tensor: Tensor) -> ModuleType:
    if tensor.is_cuda:
        return _triton()
    return cpu_kernels if tensor.device.type == "cpu" and cpu_kernels.available() else reference


def fused_moe_for(ops: ModuleType) -> Callable[..., Tensor]:
    """The mixture-of-experts computation of backend ``ops`` (a ``get_backend`` module), with
    ``kernels.moe_reference.fused_moe``'s signature: the Triton fused-MoE kernel (``kernels.moe_triton``) for
    the triton backend; for the others the grouped torch path with that backend's ``silu_and_mul``, which is
    HF's order (float32 bit for bit) and what the CPU runs best (one oneDNN matmul per chosen expert)."""
    if ops.__name__ == "kernels.triton_kernels":
        return importlib.import_module("kernels.moe_triton").fused_moe
    return functools.partial(moe_reference.fused_moe, silu_and_mul=ops.silu_and_mul)


def fused_moe(x: Tensor, gate_up: Tensor, down: Tensor, experts: Tensor, weights: Tensor,
              gate_up_scales: Tensor | None = None, down_scales: Tensor | None = None) -> Tensor:
    """See ``kernels.moe_reference.fused_moe``."""
    return fused_moe_for(_for(x))(x, gate_up, down, experts, weights, gate_up_scales, down_scales)


def silu_and_mul(x: Tensor) -> Tensor:
    """See ``kernels.reference.silu_and_mul``."""
    return _for(x).silu_and_mul(x)


def gelu_tanh_and_mul(x: Tensor) -> Tensor:
    """See ``kernels.reference.gelu_tanh_and_mul``."""
    return _for(x).gelu_tanh_and_mul(x)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """See ``kernels.reference.rms_norm``."""
    return _for(x).rms_norm(x, weight, eps)


def rotary_embedding_(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """See ``kernels.reference.rotary_embedding_``."""
    _for(x).rotary_embedding_(x, cos, sin)


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """See ``kernels.reference.reshape_and_cache``."""
    _for(key_cache).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, scale: float, out: Tensor | None = None,
                           window: int | None = None, softcap: float | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_decode``."""
    return _for(query).paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale,
                                              out=out, window=window, softcap=softcap)


def paged_attention_prefill(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor,
                            context_lens: Tensor, query_start_loc: Tensor, scale: float,
                            out: Tensor | None = None, window: int | None = None,
                            softcap: float | None = None) -> Tensor:
    """See ``kernels.reference.paged_attention_prefill``."""
    return _for(query).paged_attention_prefill(query, key_cache, value_cache, block_tables, context_lens,
                                               query_start_loc, scale, out=out, window=window, softcap=softcap)


def copy_blocks(key_caches: list[Tensor], value_caches: list[Tensor], block_mapping: Tensor) -> None:
    """See ``kernels.reference.copy_blocks``."""
    if key_caches:
        _for(key_caches[0]).copy_blocks(key_caches, value_caches, block_mapping)
