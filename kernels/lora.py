"""The batched LoRA delta of one step: every token row carries its adapter's device slot, or none.

For a layer with adapters stacked by slot, ``a[num_slots, max_rank, in]`` and ``b[num_slots, out, max_rank]``
(the adapter's scaling folded into ``b``, zero past ``ranks[s]``, the rank in slot ``s``, 0 for a slot that
does not adapt this layer; a fused layer packs its parts' ranks side by side, ``b`` block-diagonal),
``add_lora`` adds in place, for each row ``t`` whose slot is ``s``::

    y[t] += (x[t] @ a[s, :ranks[s]].T) @ b[s, :, :ranks[s]].T      (shrink to rank, then expand)

Rows of the base model are neither read nor written, so they add exactly nothing. ``LoRAIndex.token_slots``
marks them -1 only as data for the Triton kernel, which masks them out; no code ever indexes a stack with
it (torch would silently read the last slot).

``add_lora`` runs the Triton shrink/expand kernels (``kernels.lora_triton``) on CUDA tensors and the torch
reference (``reference_add_lora``: one shrink/expand matmul pair per adapter present) otherwise.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LoRAIndex", "add_lora", "reference_add_lora"]


@dataclass(frozen=True)
class LoRAIndex:
    """Which rows of a step belong to which adapter slot; built once per step, used by every layer.

    token_slots  int32 ``[num_tokens]``: the row's slot, -1 for a base-model row (Triton only)
    groups       ``(slot, rows)`` for every slot present, base rows in none; ``rows`` is a slice when the
                 slot's rows are contiguous (views, no copies), else an int64 index tensor
    """

    token_slots: Tensor
    groups: tuple[tuple[int, slice | Tensor], ...]

    @classmethod
    def build(cls, segments: list[tuple[int | None, int]], device: torch.device | str) -> LoRAIndex:
        """From consecutive ``(slot or None, num_rows)`` segments, in row order (one per sequence)."""
        slots: list[int] = []
        ranges: dict[int, list[tuple[int, int]]] = {}
        for slot, count in segments:
            if slot is not None:
                if slot < 0:
                    raise ValueError(f"adapter slots are >= 0, got {slot}")
                ranges.setdefault(slot, []).append((len(slots), len(slots) + count))
            slots.extend([-1 if slot is None else slot] * count)
        groups = []
        for slot, spans in ranges.items():
            merged = [list(spans[0])]
            for start, end in spans[1:]:
                if start == merged[-1][1]:
                    merged[-1][1] = end
                else:
                    merged.append([start, end])
            if len(merged) == 1:
                rows: slice | Tensor = slice(merged[0][0], merged[0][1])
            else:
                rows = torch.cat([torch.arange(s, e) for s, e in merged]).to(device)
            groups.append((slot, rows))
        return cls(torch.tensor(slots, dtype=torch.int32, device=device), tuple(groups))

    @property
    def num_tokens(self) -> int:
        return self.token_slots.shape[0]


def check_lora_args(y: Tensor, x: Tensor, a: Tensor, b: Tensor, ranks: Tensor, index: LoRAIndex) -> None:
    """Shapes shared by both backends: one slot count, one rank, rows of x and y agree with the index."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[1] != b.shape[2]:
        raise ValueError(f"a must be [slots, rank, in] and b [slots, out, rank], got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if x.shape != (index.num_tokens, a.shape[2]) or y.shape != (index.num_tokens, b.shape[1]):
        raise ValueError(f"x must be [{index.num_tokens}, {a.shape[2]}] and y [{index.num_tokens}, {b.shape[1]}], "
                         f"got {tuple(x.shape)} and {tuple(y.shape)}")
    if ranks.shape != (a.shape[0],):
        raise ValueError(f"ranks must be [{a.shape[0]}], got {tuple(ranks.shape)}")


def reference_add_lora(y: Tensor, x: Tensor, a: Tensor, b: Tensor, ranks: Tensor, index: LoRAIndex) -> None:
    """The torch reference: per adapter present, gather its rows, shrink, expand, add back."""
    check_lora_args(y, x, a, b, ranks, index)
    rank_of = ranks.tolist()
    for slot, rows in index.groups:
        r = rank_of[slot]
        if r == 0:
            continue
        shrunk = x[rows] @ a[slot, :r].T
        if isinstance(rows, slice):
            y[rows].addmm_(shrunk, b[slot, :, :r].T)
        else:
            y.index_add_(0, rows, shrunk @ b[slot, :, :r].T)


def add_lora(y: Tensor, x: Tensor, a: Tensor, b: Tensor, ranks: Tensor, index: LoRAIndex) -> None:
    """Triton on CUDA tensors, the torch reference elsewhere (see the module docstring)."""
    if y.is_cuda:
        importlib.import_module("kernels.lora_triton").add_lora(y, x, a, b, ranks, index)
    else:
        reference_add_lora(y, x, a, b, ranks, index)
