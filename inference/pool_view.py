"""One view of the KV pool: per physical block its ref count and hash, per live sequence its block table.

Two sources build it, and they must agree after every step (tested): the block manager from the pool
itself (`BlockManager.view`) and the event replay from events alone (`inference.events.BlockMapReplay`).
Everything that shows the pool takes its figures from a `PoolView` rather than walking the pool with its
own rules: `LLMEngine.metrics()`'s block map, the lab's snapshot, a recording's starting pool. So a
block's state, its owners and their order are defined here once:

    state   "used" if its ref count is >= 1, else "cached" if it keeps a hash, else "free"
    owners  the request ids whose live sequences hold it, in the order of `tables`, each once

Plain data (no torch, no engine): it travels as JSON in a recording's `initial`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass
class PoolView:
    """`ref_counts[b]` and `hashes[b]` (a short label, `events.hash_label`) per physical block `b`;
    `tables[seq_id]` and `owners[seq_id]` (its request id) per live sequence that holds blocks."""

    ref_counts: list[int]
    hashes: list[str | None]
    tables: dict[int, list[int]] = field(default_factory=dict)
    owners: dict[int, str] = field(default_factory=dict)

    @classmethod
    def empty(cls, num_blocks: int) -> PoolView:
        return cls([0] * num_blocks, [None] * num_blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)

    def state(self, block_id: int) -> str:
        if self.ref_counts[block_id]:
            return "used"
        return "cached" if self.hashes[block_id] is not None else "free"

    def block_owners(self) -> dict[int, list[str]]:
        """Per held block, the request ids holding it (a request with n samples counts once)."""
        holders: dict[int, list[str]] = {}
        for seq_id, table in self.tables.items():
            request_id = self.owners[seq_id]
            for block_id in table:
                ids = holders.setdefault(block_id, [])
                if request_id not in ids:
                    ids.append(request_id)
        return holders

    def block_map(self) -> list[dict]:
        """Per physical block, in id order: {"state", "ref_count", "owners"} (`metrics()["block_map"]`)."""
        holders = self.block_owners()
        return [{"state": self.state(b), "ref_count": r, "owners": holders.get(b, [])}
                for b, r in enumerate(self.ref_counts)]

    def to_initial(self) -> dict:
        """As a recording's JSON `initial` (sequence ids become string keys)."""
        return {"ref_counts": list(self.ref_counts), "hashes": list(self.hashes),
                "tables": {str(k): list(v) for k, v in self.tables.items()},
                "owners": {str(k): v for k, v in self.owners.items()}}

    @classmethod
    def from_initial(cls, initial: dict) -> PoolView:
        """The inverse of `to_initial`."""
        return cls(list(initial["ref_counts"]), list(initial["hashes"]),
                   {int(k): list(v) for k, v in initial["tables"].items()},
                   {int(k): v for k, v in initial["owners"].items()})

    def copy(self) -> PoolView:
        return copy.deepcopy(self)
