"""Engine settings: what the user asks for (`EngineArgs`) and the device/dtype they resolve to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from inference.model_loader import DEFAULT_MODEL

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# vLLM's other names for the same dtypes (`LLM(dtype="half")` in its examples); stored under DTYPES' name.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
DEFAULT_CPU_KV_CACHE_MEMORY = 512 * 1024**2


@dataclass
class EngineArgs:
    """Everything `LLM(...)` accepts; names and meanings follow vLLM's offline API.

    `quantization` (None, "int8", "int4", "gguf", "awq", "gptq") picks how weights are stored; left unset it
    is read from the checkpoint (see `inference.quantization`). `quantization_group_size` (32 or 64) is the
    group of "int4" quantized at load; `dtype` stays the activation dtype.

    The KV pool is sized, in order of precedence, by `num_kv_blocks`, by `kv_cache_memory` (bytes), or on
    CUDA by `gpu_memory_utilization` (share of the device's memory the whole process may use); on CPU the
    default is 512 MiB. `dtype="auto"` resolves as `resolve_dtype` says (bfloat16 where it is native).

    `tensor_parallel_size` (vLLM's name): split the model over that many ranks, one process each (one CUDA
    device each from `device` on, or the CPU shared), see inference/parallel/. A KV budget is per device,
    so N ranks hold N times the tokens in the same per-device memory.
    """

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.9
    # None: the longest context the model and the KV pool both allow (the model's max_position_embeddings,
    # capped at the pool's tokens); a number is checked against both.
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    tensor_parallel_size: int = 1
    attention_backend: str | None = None
    # Multi-LoRA (vLLM's names): adapters in device slots at once, their largest rank, adapters kept on the
    # host (default: max_loras).
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 64
    max_cpu_loras: int | None = None
    quantization: str | None = None
    quantization_group_size: int = 32
    # Engine events kept in the ring buffer (inference/events.py); 0 records nothing unless someone listens.
    event_log_capacity: int = 0
    # vLLM's: "auto" applies the model's generation_config.json, "vllm" none, a folder path that folder's
    # (inference/generation_config.py).
    generation_config: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.event_log_capacity < 0:
            raise ValueError(f"event_log_capacity must be >= 0, got {self.event_log_capacity}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(2048, self.max_num_seqs)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs so every running decode fits a step")
        if self.attention_backend not in kernels.BACKENDS:
            raise ValueError("attention_backend must be None, 'auto', 'triton', 'cpu' or 'torch', "
                             f"got {self.attention_backend!r}")
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted([*DTYPES, *DTYPE_ALIASES])}, "
                             f"got {self.dtype!r}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but torch sees no CUDA device")
        return device

    def resolve_dtype(self, device: torch.device, quantized: bool = False) -> torch.dtype:
        """bfloat16 on CUDA; float32 on CPU, the oracle mode that equals HF transformers token for token;
        bfloat16 for quantized weights on a CPU with bfloat16 arithmetic (AVX-512 BF16, AMX).

        Quantized weights run fast only with bfloat16 activations on the CPU (the tiled AMX kernels, torch's
        int4 kernel); float32 activations take the de-quantise-then-matmul oracle path, which ran GGUF SmolLM2
        at 4.2 tok/s against 63 in bfloat16 (issue 39). A quantized model is never the oracle anyway.
        `dtype="bfloat16"` is faster for float weights too; it is not their CPU default because the served
        stack's tests compare greedy texts across batch compositions, which bfloat16 does not keep (see
        BENCHMARKS.md, "Engine speed vs vLLM CPU").
        """
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if device.type == "cuda" or (quantized and cpu_has_bfloat16()):
            return torch.bfloat16
        return torch.float32


def cpu_has_bfloat16() -> bool:
    """Whether this CPU computes in bfloat16 natively (oneDNN's test: AVX-512 BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
