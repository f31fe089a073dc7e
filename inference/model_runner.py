"""Owns the model weights and the paged KV cache; turns a scheduled step into logits.

The KV cache is one (key_cache, value_cache) pair per layer, each
`[num_blocks, block_size, num_kv_heads, head_dim]`. `execute` builds one flattened batch (input ids,
positions, slot mapping, block tables, context lengths, query start offsets), performs pending
copy-on-write block copies, runs the forward and returns logits only for the sequences that sample.
"""

from __future__ import annotations

from pathlib import Path

import torch

import kernels
from inference.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from inference.lora_slots import LoRAManager
from inference.model import AttentionMetadata, ModelConfig, load_model
from inference.model_loader import find_gguf
from inference.quantization import resolve_quantization
from inference.scheduler import ScheduledSeq


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one physical block takes across all layers, K and V."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights (parameters and buffers, a tied table counted once), RoPE tables excluded."""
    buffers = (t for name, t in model.named_buffers() if not name.startswith("rope."))
    tensors = {id(t): t for t in (*model.parameters(), *buffers)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


class ModelRunner:
    def __init__(self, args: EngineArgs, folder: Path) -> None:
        self.device = args.resolve_device()
        self.dtype = args.resolve_dtype(self.device)
        self.block_size = args.block_size
        self.quantization = resolve_quantization(
            args.quantization, folder, find_gguf(args.model, folder), self.device, args.quantization_group_size)
        self.model = load_model(folder, self.device, self.dtype, self.quantization)
        self.weight_bytes = resident_bytes(self.model)
        self.cfg = self.model.cfg
        if args.max_model_len > self.cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len {args.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.cfg.max_position_embeddings}"
            )
        self.ops = kernels.get_backend(args.attention_backend, self.device)
        self.num_blocks = self._num_blocks(args)
        shape = (self.num_blocks, self.block_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(self.cfg.num_layers)
        ]
        self.lora = (LoRAManager(self.model, args.max_loras, args.max_lora_rank, args.max_cpu_loras, self.device,
                                 self.dtype) if args.enable_lora else None)
        self.kv_pool_bytes = self.num_blocks * kv_block_bytes(self.cfg, self.block_size, self.dtype)

    @property
    def quantization_name(self) -> str:
        """The weights' method as users name it: "float32"/"bfloat16"/... for float weights, else the method."""
        if self.quantization is None:
            return str(self.dtype).removeprefix("torch.")
        return self.quantization.method

    def _num_blocks(self, args: EngineArgs) -> int:
        per_block = kv_block_bytes(self.cfg, self.block_size, self.dtype)
        if args.num_kv_blocks is not None:
            return args.num_kv_blocks
        if args.kv_cache_memory is not None:
            budget = args.kv_cache_memory
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            in_use = total - free
            # Leave room for one full batch of activations (generous: ~hidden*32 floats per token + logits).
            activations = args.max_num_batched_tokens * (self.cfg.hidden_size * 32 + self.cfg.vocab_size) * 4
            budget = int(total * args.gpu_memory_utilization) - in_use - activations
        else:
            budget = DEFAULT_CPU_KV_CACHE_MEMORY
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"the KV cache budget ({budget} bytes) is smaller than one block ({per_block} bytes)")
        return num_blocks

    def execute(
        self, scheduled: list[ScheduledSeq], sample_rows: list[int], block_copies: list[tuple[int, int]]
    ) -> torch.Tensor:
        """Run one step; return float32 logits for the scheduled entries listed in `sample_rows`, in that order.

        With LoRA the batch's rows are laid out grouped by adapter (`LoRAManager.row_order`); nothing
        outside this method sees that order.
        """
        if block_copies:
            mapping = torch.tensor(block_copies, dtype=torch.int64, device=self.device)
            self.ops.copy_blocks([k for k, _ in self.kv_caches], [v for _, v in self.kv_caches], mapping)
        if self.lora is not None:
            order = self.lora.row_order([item.seq.request.adapter for item in scheduled])
            position = {i: k for k, i in enumerate(order)}
            scheduled = [scheduled[i] for i in order]
            sample_rows = [position[i] for i in sample_rows]
        input_ids, positions, slots, ctx_lens, q_starts = [], [], [], [], [0]
        bs = self.block_size
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            ctx_lens.append(end)
            q_starts.append(q_starts[-1] + item.num_new_tokens)
        max_blocks = max(len(item.seq.block_table) for item in scheduled)
        tables = [item.seq.block_table + [0] * (max_blocks - len(item.seq.block_table)) for item in scheduled]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            block_tables=tensor(tables, torch.int32),
            context_lens=tensor(ctx_lens, torch.int32),
            query_start_loc=tensor(q_starts, torch.int32),
            is_decode=len(input_ids) == len(scheduled),
        )
        if self.lora is not None:
            self.lora.begin_step([(item.seq.request.adapter, item.num_new_tokens) for item in scheduled])
        try:
            hidden = self.model(
                tensor(input_ids, torch.int64), tensor(positions, torch.int64), self.kv_caches, meta, self.ops
            )
        finally:
            if self.lora is not None:
                self.lora.end_step()
        last_rows = tensor([q_starts[i + 1] - 1 for i in sample_rows], torch.int64)
        return self.model.compute_logits(hidden[last_rows])
