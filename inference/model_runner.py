"""Owns the model weights and the paged KV cache; turns a scheduled step into logits.

The KV cache is one (key_cache, value_cache) pair per layer, each
`[num_blocks, block_size, num_kv_heads, head_dim]`. `execute` builds one flattened batch (`StepBatch`:
input ids, positions, slot mapping, block tables, context lengths, query start offsets), and `run` performs
pending copy-on-write block copies, runs the forward and returns logits only for the sequences that sample.

Under tensor parallelism (`tensor_parallel_size=N`) the engine's runner is rank 0: it starts ranks 1..N-1
(inference/parallel/ranks.py), each a `ModelRunner` of its own holding its shard of the weights and
`num_kv_heads / N` of every KV block. Rank 0 alone builds the batch; it broadcasts it, then every rank
runs the same `run`. The block ids are the same on every rank, so the block manager's one set of tables,
hashes and ref counts (on rank 0) serves them all.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, fields
from pathlib import Path

import torch

import kernels
from inference.config import DEFAULT_CPU_KV_CACHE_MEMORY, EngineArgs
from inference.linear import LinearWeight
from inference.lora_slots import LoRAManager
from inference.model import AttentionMetadata, ModelConfig, load_model
from inference.model_loader import find_gguf
from inference.parallel.group import Group
from inference.parallel.ranks import Ranks, check_tensor_parallel, rank_device
from inference.quantization import resolve_quantization
from inference.scheduler import ScheduledSeq


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype, tensor_parallel_size: int = 1) -> int:
    """Bytes one physical block takes across all layers, K and V (or one latent entry, with latent attention),
    on one of `tensor_parallel_size` ranks."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    tensors = 1 if cfg.mla else 2
    return tensors * cfg.num_layers * block_size * (cfg.num_kv_heads // tensor_parallel_size) * cfg.head_dim * itemsize


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights, RoPE tables excluded: each `LinearWeight` as it counts itself (a packed
    one holds no parameter), a weight shared by two layers once, then the other parameters (norms, biases)."""
    weights = {id(m): m for m in model.modules() if isinstance(m, LinearWeight)}
    inside = {id(t) for m in weights.values() for t in (*m.parameters(), *m.buffers())}
    named = (*model.named_parameters(), *model.named_buffers())
    rest = {id(t): t for name, t in named if not name.startswith("rope.") and id(t) not in inside}
    return sum(m.nbytes for m in weights.values()) + sum(t.numel() * t.element_size() for t in rest.values())


@functools.cache
def keep_freed_activations() -> bool:
    """On glibc, keep freed activation buffers in the process's heap instead of handing them back to the OS.

    A CPU step allocates and frees tens of MB of activations a layer. By default glibc maps a buffer above its
    mmap threshold afresh and unmaps it when freed, so a step pays one page fault for every 4 KiB it touches: up
    to 90,000 faults and a third of a 2,048-token bfloat16 step (BENCHMARKS.md, issue 12). With this, buffers up to
    32 MiB (glibc's ceiling for the setting) come from the heap, and up to 512 MiB freed at its top stays mapped
    for the next step. Process-wide, done once; False where the C library has no `mallopt` (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 512 << 20))


class ModelRunner:
    def __init__(self, args: EngineArgs, folder: Path, weights_of: ModelRunner | None = None,
                 group: Group | None = None) -> None:
        """The engine's runner (rank 0, starting the other ranks if `args.tensor_parallel_size > 1`), or with
        `group`, the runner of rank `group.rank` in a rank process. `weights_of`: another engine's runner
        whose weights this one uses (a lab sandbox), with its own KV pool."""
        self.ranks: Ranks | None = None
        self.device = args.resolve_device()
        if args.tensor_parallel_size > 1:
            self.device = rank_device(self.device, group.rank if group else 0)
        if self.device.type == "cpu":
            keep_freed_activations()
        self.block_size = args.block_size
        if weights_of is None:
            self.quantization = resolve_quantization(
                args.quantization, folder, find_gguf(args.model, folder), self.device, args.quantization_group_size)
        self.dtype = args.resolve_dtype(self.device, quantized=(weights_of or self).quantization is not None)
        if weights_of is None:
            if group is None and args.tensor_parallel_size > 1:
                check_tensor_parallel(args, ModelConfig.from_folder(folder), self.device, self.quantization)
                self.ranks = Ranks(args, folder, self.device, type(self))
                group = self.ranks.group
        elif weights_of.group.size > 1:
            raise ValueError(f"an engine cannot share a tensor-parallel engine's weights (tensor_parallel_size="
                             f"{weights_of.group.size}): its other ranks run only the first engine's steps")
        self.group = group or Group.single()
        try:
            self._load(args, folder, weights_of)
        except BaseException as exc:
            if self.ranks is not None:  # the other ranks may be mid-collective: no stop message, a kill
                self.ranks.abort(f"rank 0 failed to start: {type(exc).__name__}: {exc}")
            raise

    def _load(self, args: EngineArgs, folder: Path, weights_of: ModelRunner | None) -> None:
        if weights_of is None:
            self.model = load_model(folder, self.device, self.dtype, self.quantization, self.group,
                                    args.max_model_len)
        else:  # another engine's weights (a lab sandbox's), quantized or not; this runner's own KV pool
            self.quantization, self.model = weights_of.quantization, weights_of.model
        self.weight_bytes_per_rank = resident_bytes(self.model)
        self.cfg = self.model.cfg
        if args.max_model_len is not None and args.max_model_len > self.cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len {args.max_model_len} exceeds the model's "
                f"max_position_embeddings {self.cfg.max_position_embeddings}"
            )
        self.ops = kernels.get_backend(args.attention_backend, self.device)
        self.num_blocks = self.group.min(self._num_blocks(args))  # each rank's memory allows; all use the least
        shape = (self.num_blocks, self.block_size, self.cfg.num_kv_heads // self.group.size, self.cfg.head_dim)
        # A layer's (key cache, value cache); with latent attention one tensor serves as both (inference/mla.py).
        self.kv_caches = []
        for _ in range(self.cfg.num_layers):
            key = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.kv_caches.append((key, key if self.cfg.mla else torch.zeros_like(key)))
        if args.enable_lora and self.cfg.moe is not None:
            raise ValueError("enable_lora does not support a mixture of experts yet (adapters on the experts are "
                             "not implemented; the attention's alone would be a different model than PEFT's)")
        if args.enable_lora and self.cfg.mla is not None:
            raise ValueError("enable_lora does not support latent attention yet (its projections are not LoRA "
                             "targets here)")
        self.lora = (LoRAManager(self.model, args.max_loras, args.max_lora_rank, args.max_cpu_loras, self.device,
                                 self.dtype) if args.enable_lora else None)
        self.kv_pool_bytes_per_rank = self.num_blocks * self._block_bytes
        # Cache bytes one token takes across all layers and ranks (a key and a value per KV head, or one latent +
        # RoPE key with latent attention): fixed by the model and dtype, so computed once, not per metrics().
        self.kv_bytes_per_token = kv_block_bytes(self.cfg, 1, self.dtype)
        # Every rank's shard has rank 0's shapes (inference/parallel/layers.py), so totals are N times these.
        self.weight_bytes = self.weight_bytes_per_rank * self.group.size
        self.kv_pool_bytes = self.kv_pool_bytes_per_rank * self.group.size

    @property
    def _block_bytes(self) -> int:
        return kv_block_bytes(self.cfg, self.block_size, self.dtype, self.group.size)

    @property
    def quantization_name(self) -> str:
        """The weights' method as users name it: "float32"/"bfloat16"/... for float weights, else the method."""
        if self.quantization is None:
            return str(self.dtype).removeprefix("torch.")
        return self.quantization.method

    def _num_blocks(self, args: EngineArgs) -> int:
        """Blocks this rank's KV budget holds (a budget is per device: N ranks hold N times the tokens)."""
        per_block = self._block_bytes
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
        self, scheduled: list[ScheduledSeq], sample_rows: list[int], block_copies: list[tuple[int, int]],
        prompt_rows: dict[int, tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """Run one step; return float32 logits for the scheduled entries listed in `sample_rows`, in that order,
        then, for each entry `i: (offset, count)` of `prompt_rows` in order, the logits of `count` consecutive
        tokens of entry i's chunk from its `offset`-th on (prompt logprobs; None or {} for the plain step).

        With LoRA the batch's rows are laid out grouped by adapter (`LoRAManager.row_order`); nothing
        outside this method sees that order. Under tensor parallelism any failure once the batch is sent
        raises `RankFailedError` (the ranks are out of step for good, and stopped).
        """
        if self.lora is not None:
            order = self.lora.row_order([item.seq.request.adapter for item in scheduled])
            position = {i: k for k, i in enumerate(order)}
            scheduled = [scheduled[i] for i in order]
            sample_rows = [position[i] for i in sample_rows]
            prompt_rows = {position[i]: span for i, span in (prompt_rows or {}).items()}
        batch = StepBatch.build(scheduled, sample_rows, block_copies, self.block_size, prompt_rows)
        if self.ranks is not None:
            try:
                self.ranks.send(batch.to_payload())
                return self.run(batch)
            except Exception as exc:
                raise self.ranks.fail(exc) from exc
        if self.lora is not None:
            self.lora.begin_step([(item.seq.request.adapter, item.num_new_tokens) for item in scheduled])
        try:
            return self.run(batch)
        finally:
            if self.lora is not None:
                self.lora.end_step()

    def run(self, batch: StepBatch) -> torch.Tensor | None:
        """Copy-on-write copies, then the forward of `batch`: its sampled rows' logits on rank 0, None on the
        other ranks (which every step of rank 0 runs this on, in the same order)."""
        if batch.block_copies.numel():
            mapping = batch.block_copies.to(self.device)
            self.ops.copy_blocks([k for k, _ in self.kv_caches], [v for _, v in self.kv_caches], mapping)
        meta = AttentionMetadata(
            slot_mapping=batch.slot_mapping.to(self.device),
            block_tables=batch.block_tables.to(self.device, torch.int32),
            context_lens=batch.context_lens.to(self.device, torch.int32),
            query_start_loc=batch.query_start_loc.to(self.device, torch.int32),
            is_decode=batch.input_ids.numel() == batch.context_lens.numel(),
        )
        hidden = self.model(batch.input_ids.to(self.device), batch.positions.to(self.device), self.kv_caches, meta,
                            self.ops, rows=batch.sample_rows.to(self.device))
        return self.model.compute_logits(hidden)

    def follow(self, payload: torch.Tensor) -> None:
        """On ranks 1..N-1 (inference/parallel/ranks.py): run the step rank 0 sent as a payload."""
        self.run(StepBatch.from_payload(payload))

    def check_alive(self) -> None:
        """Raise `RankFailedError` if a tensor-parallel rank has died (then this runner cannot step again)."""
        if self.ranks is not None:
            self.ranks.check_alive()

    def close(self) -> None:
        """Stop the other ranks' processes (idempotent; nothing to do without tensor parallelism)."""
        if self.ranks is not None:
            self.ranks.close()


@dataclass
class StepBatch:
    """One step's flattened batch, every field a CPU int64 tensor: what each rank's `run` takes.

    input_ids, positions, slot_mapping   one entry per token of the step
    block_tables                         [seqs, max blocks], padded with 0 past each sequence's blocks
    context_lens                         one per sequence; query_start_loc: seqs + 1 offsets into the tokens
    sample_rows                          the token rows whose logits are returned: each sampled entry's last
                                         token, then the prompt-logprob rows (`ModelRunner.execute`)
    block_copies                         [copies, 2] (source block, destination block), done before the forward

    `to_payload` packs it into one tensor for rank 0's broadcast; `from_payload` unpacks it on each rank.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    sample_rows: torch.Tensor
    block_copies: torch.Tensor

    @classmethod
    def build(cls, scheduled: list[ScheduledSeq], sample_rows: list[int], block_copies: list[tuple[int, int]],
              block_size: int, prompt_rows: dict[int, tuple[int, int]] | None = None) -> StepBatch:
        input_ids, positions, slots, ctx_lens, q_starts = [], [], [], [], [0]
        bs = block_size
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

        def tensor(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        rows = [q_starts[i + 1] - 1 for i in sample_rows]
        for i, (offset, count) in (prompt_rows or {}).items():
            rows.extend(range(q_starts[i] + offset, q_starts[i] + offset + count))
        return cls(tensor(input_ids), tensor(positions), tensor(slots), tensor(tables), tensor(ctx_lens),
                   tensor(q_starts), tensor(rows),
                   tensor(block_copies).view(-1, 2))

    def to_payload(self) -> torch.Tensor:
        """`[tokens, seqs, max blocks, samples, copies]` then every field flattened, in field order."""
        parts = [getattr(self, f.name) for f in fields(self)]
        sizes = [self.input_ids.numel(), *self.block_tables.shape, self.sample_rows.numel(),
                 self.block_copies.shape[0]]
        return torch.cat([torch.tensor(sizes, dtype=torch.int64), *(p.flatten() for p in parts)])

    @classmethod
    def from_payload(cls, payload: torch.Tensor) -> StepBatch:
        tokens, seqs, max_blocks, samples, copies = payload[:5].tolist()
        shapes = [(tokens,), (tokens,), (tokens,), (seqs, max_blocks), (seqs,), (seqs + 1,), (samples,), (copies, 2)]
        values, offset = [], 5
        for shape in shapes:
            count = shape[0] * (shape[1] if len(shape) > 1 else 1)
            values.append(payload[offset : offset + count].view(shape))
            offset += count
        return cls(*values)
