"""Serving many LoRA adapters at once: a host-side cache, `max_loras` device slots, the per-step row index.

- Host cache (`get`, any thread): adapters read from disk, the `max_cpu_loras` most recently used kept in
  memory (a live request keeps its own adapter alive regardless).
- Device slots (`acquire`, loop thread): every adapted `Linear` gets a `LoRALayer` hook whose A/B stacks
  hold one adapter per slot. A waiting sequence is admitted only once its adapter is in a slot; a slot is
  replaced least recently used first, and never while a running sequence uses it, so an adapter that
  does not fit yet waits (the scheduler skips it) rather than being refused.
- Per step (`begin_step` / `end_step`, the model runner): each token row's slot, as one `kernels.lora`
  `LoRAIndex` that every hook reads; rows of base-model sequences belong to no slot and get no delta.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

import torch

import kernels.lora
from inference.linear import Linear
from inference.lora import TARGET_MODULES, LoRAAdapter, LoRARequest, load_adapter
from inference.model import LlamaForCausalLM
from inference.openmp import on_own_thread


class LoRALayer:
    """The LoRA delta of one `Linear`, every part of a fused output (q/k/v, gate/up) in one shrink/expand.

    Stacks, allocated on the first adapter that adapts this layer: `a[max_loras, parts * max_rank, in]`,
    `b[max_loras, out, parts * max_rank]`. A slot packs its adapter's targeted parts side by side: part p's
    A takes the next `r` rows of `a`, its B the same `r` columns of `b`, in the rows of p's output slice
    (so `b` is block-diagonal and the delta of each part lands in its own slice). `ranks[slot]` is the
    packed width, 0 where the slot's adapter leaves this layer alone, which the kernels read as "add nothing".
    """

    def __init__(self, manager: LoRAManager, linear: Linear) -> None:
        self.manager = manager
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.sizes = linear.output_sizes
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.a: torch.Tensor | None = None
        self.b: torch.Tensor | None = None
        self.ranks = torch.zeros(manager.max_loras, dtype=torch.int32, device=manager.device)

    def load(self, slot: int, parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one adapter's `{part: (A [r, in], B [out_part, r])}` for this layer into `slot`."""
        m = self.manager
        width = len(self.sizes) * m.max_rank
        if self.a is None:
            self.a = torch.zeros(m.max_loras, width, self.in_features, dtype=m.dtype, device=m.device)
            self.b = torch.zeros(m.max_loras, self.out_features, width, dtype=m.dtype, device=m.device)
        self.a[slot].zero_()
        self.b[slot].zero_()
        column = 0
        for part, (a, b) in sorted(parts.items()):
            rank, offset = a.shape[0], self.offsets[part]
            self.a[slot, column:column + rank] = a
            self.b[slot, offset:offset + self.sizes[part], column:column + rank] = b
            column += rank
        self.ranks[slot] = column

    def clear(self, slot: int) -> None:
        self.ranks[slot] = 0

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add this step's per-row adapter deltas to `y = x @ W.T` in place (no-op without adapter rows)."""
        index = self.manager.index
        if index is not None and self.a is not None:
            kernels.lora.add_lora(y, x, self.a, self.b, self.ranks, index)


class LoRAManager:
    """Every adapter-related state of one engine; installs a `LoRALayer` on each adaptable `Linear`."""

    def __init__(self, model: LlamaForCausalLM, max_loras: int, max_lora_rank: int, max_cpu_loras: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.cfg = model.cfg
        self.max_loras, self.max_rank, self.max_cpu_loras = max_loras, max_lora_rank, max_cpu_loras
        self.device, self.dtype = device, dtype
        # This step's row -> slot index, per thread: only the engine's loop thread sets it, so a forward
        # another thread runs through the same shared layers (a lab sandbox's) adds no adapter delta.
        self._step = threading.local()
        self._hooks: dict[tuple[int, str], LoRALayer] = {}
        for i, layer in enumerate(model.layers):
            for sublayer, linear_name, _ in TARGET_MODULES.values():
                key = (i, linear_name)
                if key not in self._hooks:
                    linear = getattr(getattr(layer, sublayer), linear_name)
                    self._hooks[key] = linear.lora = LoRALayer(self, linear)
        self._host: OrderedDict[LoRARequest, LoRAAdapter] = OrderedDict()
        self._host_lock = threading.Lock()
        # Resident adapters by digest, least recently used first, and the slots nobody holds.
        self._slots: OrderedDict[str, int] = OrderedDict()
        self._free_slots = list(range(max_loras))
        self.num_slot_loads = 0

    # --- host side (any thread) -------------------------------------------------------------------

    def get(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter for `request`, from the host cache or read from its folder (raises LoRAError)."""
        with self._host_lock:
            adapter = self._host.get(request)
            if adapter is not None:
                self._host.move_to_end(request)
                return adapter
        # Outside the lock (disk and checks), and off the caller's thread: converting and scaling a large
        # adapter's tensors runs OpenMP regions, whose team would outlive the call (openmp.py).
        adapter = on_own_thread(load_adapter, request, self.cfg, self.max_rank)
        with self._host_lock:
            self._host[request] = adapter
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)
        return adapter

    # --- device slots (loop thread) ----------------------------------------------------------------

    def slot_of(self, adapter: LoRAAdapter) -> int:
        return self._slots[adapter.digest]

    def row_order(self, adapters: list[LoRAAdapter | None]) -> list[int]:
        """An order of a step's sequences that makes each adapter's rows contiguous (base rows first), so
        that every adapter's delta is one slice of the batch: no gathers, one shrink and one expand."""
        return sorted(range(len(adapters)), key=lambda i: -1 if adapters[i] is None else self.slot_of(adapters[i]))

    def acquire(self, adapter: LoRAAdapter, in_use: Iterable[str]) -> bool:
        """Make `adapter` resident; False when every slot holds an adapter in `in_use` (digests)."""
        if adapter.digest in self._slots:
            self._slots.move_to_end(adapter.digest)
            return True
        if self._free_slots:
            slot = self._free_slots.pop(0)
        else:
            busy = set(in_use)
            victim = next((d for d in self._slots if d not in busy), None)
            if victim is None:
                return False
            slot = self._slots.pop(victim)
        per_layer: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for (layer, module), (a, b) in adapter.weights.items():
            _, linear_name, part = TARGET_MODULES[module]
            per_layer.setdefault((layer, linear_name), {})[part] = (a.to(self.device, self.dtype),
                                                                    b.to(self.device, self.dtype))
        for key, hook in self._hooks.items():
            if key in per_layer:
                hook.load(slot, per_layer[key])
            else:
                hook.clear(slot)
        self._slots[adapter.digest] = slot
        self.num_slot_loads += 1
        return True

    # --- one step (model runner) -------------------------------------------------------------------

    @property
    def index(self) -> kernels.lora.LoRAIndex | None:
        return getattr(self._step, "index", None)

    def begin_step(self, segments: list[tuple[LoRAAdapter | None, int]]) -> None:
        """Index this step's rows: consecutive (adapter or None, num_rows) segments, one per sequence."""
        if all(adapter is None for adapter, _ in segments):
            self._step.index = None
            return
        self._step.index = kernels.lora.LoRAIndex.build(
            [(None if adapter is None else self.slot_of(adapter), rows) for adapter, rows in segments], self.device)

    def end_step(self) -> None:
        self._step.index = None
