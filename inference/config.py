"""Engine settings: what the user asks for (`EngineArgs`) and the device/dtype they resolve to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from inference.model_loader import DEFAULT_MODEL

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_CPU_KV_CACHE_MEMORY = 512 * 1024**2


@dataclass
class EngineArgs:
    """Everything `LLM(...)` accepts; names and meanings follow vLLM's offline API.

    The KV pool is sized, in order of precedence, by `num_kv_blocks`, by `kv_cache_memory` (bytes), or on
    CUDA by `gpu_memory_utilization` (share of the device's memory the whole process may use); on CPU the
    default is 512 MiB. `dtype="auto"` resolves as `resolve_dtype` says (bfloat16 where it is native).
    """

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    attention_backend: str | None = None

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(2048, self.max_num_seqs)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs so every running decode fits a step")
        if self.attention_backend not in kernels.BACKENDS:
            raise ValueError("attention_backend must be None, 'auto', 'triton', 'cpu' or 'torch', "
                             f"got {self.attention_backend!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but torch sees no CUDA device")
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        """bfloat16 on CUDA, and on CPUs with native bfloat16 dot products (AVX-512 BF16 or AMX), else float32.

        Without those instructions bfloat16 matmuls are emulated and slower than float32. float32 stays the
        oracle mode: tests that compare against HF transformers ask for it explicitly.
        """
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.float32


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bfloat16 dot products natively (what oneDNN needs for fast bfloat16 matmuls)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
