"""A worker's KV snapshot: what `/ws/memory/` and the chat page's KV panel draw (static/common/snapshot.js).

Typed parts over plain data (no Django, no torch), so the shape is tested without a model. The engine's
`metrics()` refreshes its counters after every step but its block map only every ~100 ms, carrying the
last map over in between without the block tables ("sequences") taken with it. So `KvSampler` splits what
it samples into parts, each stamped with the sample it came from: the counters (every sample), and the
block map together with the sequences of the same engine step (`Memory`, only from a sample that had
both). A full snapshot is the latest counters with the latest matching map and tables — never a map with
another step's tables, and never a KeyError between map refreshes. Shape on the wire:

    {"type": "snapshot", "worker": str, "time": float (epoch seconds),
     "stamps": {"counters": int, "block_map": int (full snapshots only)},
     "metrics": the engine's metrics() without "block_map" and "sequences",
     "tokens_per_s": float, "latency": {"ttft_ms": {p50, p90, p99}, "itl_ms": {...}, "requests": int},
     "block_map": {"states": "fuscc...", "ref_counts": {"<block id>": int}, "owners": {"<block id>": [ids]}},
     "requests": [{"request_id", "index", "adapter": LoRA adapter name or None, "block_table": [int...],
                   "context_len", "max_len", "outside_window": leading blocks every layer's sliding window has
                   passed (kept, never read; 0 unless every layer is windowed)}]}

`metrics["contiguous"]` is the engine's contiguous-allocation counterfactual under both named policies
(inference/counterfactual.py): every view (memory, demo, lab) shows those figures and computes none.

The block map is compact so that a GPU-sized pool (100k+ blocks) fits a channel-layer message: one state
character per physical block (f free, u used by one sequence, s shared by several, c cached and evictable);
ref counts only where the state does not imply them (shared blocks: u means 1, f and c mean 0); owners only
for blocks in use. `requests` holds one entry per running sequence (a request with n samples has n).
The chat page gets `build_summary()` alone: no block map and requests, which name other users' requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATE_CODES = {"free": "f", "used": "u", "shared": "s", "cached": "c"}


def encode_block_map(block_map: list[dict[str, Any]]) -> dict[str, Any]:
    """Compact form of the engine's block map (a list of {"state", "ref_count", "owners"} per block)."""
    states = []
    ref_counts: dict[str, int] = {}
    owners: dict[str, list[str]] = {}
    for block_id, block in enumerate(block_map):
        state, ref_count = block["state"], block["ref_count"]
        if state == "used" and ref_count > 1:
            state = "shared"
            ref_counts[str(block_id)] = ref_count
        if state not in STATE_CODES:
            raise ValueError(f"block {block_id} has unknown state {state!r}")
        states.append(STATE_CODES[state])
        if block["owners"]:
            owners[str(block_id)] = list(block["owners"])
    return {"states": "".join(states), "ref_counts": ref_counts, "owners": owners}


@dataclass(frozen=True)
class Counters:
    """The engine's figures (no block map, no sequences), from sample `stamp`."""

    stamp: int
    figures: dict[str, Any]


@dataclass(frozen=True)
class Memory:
    """The block map and the block tables of one engine step, from sample `stamp`."""

    stamp: int
    block_map: list[dict[str, Any]]
    sequences: list[dict[str, Any]]


class KvSampler:
    """Splits successive `metrics(block_map=True)` dicts of one engine into stamped parts (one thread)."""

    def __init__(self) -> None:
        self._stamp = 0
        self._memory: Memory | None = None

    def sample(self, metrics: dict[str, Any]) -> tuple[Counters, Memory | None]:
        """The counters of `metrics`, and the latest block map with its own step's tables (None before the
        first sample that had both)."""
        self._stamp += 1
        if "block_map" in metrics and "sequences" in metrics:
            if self._memory is None or metrics["block_map"] is not self._memory.block_map:
                self._memory = Memory(self._stamp, metrics["block_map"], metrics["sequences"])
        figures = {k: v for k, v in metrics.items() if k not in ("block_map", "sequences")}
        return Counters(self._stamp, figures), self._memory


def build_summary(
    worker: str, counters: Counters, tokens_per_s: float, latency: dict[str, Any], now: float
) -> dict[str, Any]:
    """The figures only: nothing that names a request (for the chat page, which any user may open), and
    cheap (no pass over the block pool)."""
    return {
        "type": "snapshot",
        "worker": worker,
        "time": now,
        "stamps": {"counters": counters.stamp},
        "metrics": counters.figures,
        "tokens_per_s": round(tokens_per_s, 2),
        "latency": latency,
    }


def with_block_map(summary: dict[str, Any], memory: Memory) -> dict[str, Any]:
    """The full snapshot: `summary` plus the block map and block tables, both of one engine step
    (`memory`)."""
    return {
        **summary,
        "stamps": {**summary["stamps"], "block_map": memory.stamp},
        "block_map": encode_block_map(memory.block_map),
        "requests": memory.sequences,
    }
