"""A worker's KV snapshot: what `/ws/memory/` and the chat page's KV panel draw (static/common/snapshot.js).

Plain functions over plain data (no Django, no torch), so the shape is tested without a model. Shape:

    {"type": "snapshot", "worker": str, "time": float (epoch seconds),
     "metrics": the engine's metrics() without "block_map",
     "tokens_per_s": float, "latency": {"ttft_ms": {p50, p90, p99}, "itl_ms": {...}, "requests": int},
     "block_map": {"states": "fuscc...", "ref_counts": {"<block id>": int}, "owners": {"<block id>": [ids]}},
     "requests": [{"request_id", "index", "block_table": [int...], "context_len", "max_len"}],
     "contiguous_reserved_blocks": int}

The block map is compact so that a GPU-sized pool (100k+ blocks) fits a channel-layer message: one state
character per physical block (f free, u used by one sequence, s shared by several, c cached and evictable);
ref counts only where the state does not imply them (shared blocks: u means 1, f and c mean 0); owners only
for blocks in use. `requests` holds one entry per running sequence (a request with n samples has n).
The chat page gets `build_summary()` alone: no block map and requests, which name other users' requests.
"""
from __future__ import annotations

import math
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


def contiguous_reserved_blocks(requests: list[dict[str, Any]], block_size: int) -> int:
    """Blocks the same sequences would pin if each pre-allocated its maximum length (no sharing)."""
    return sum(math.ceil(r["max_len"] / block_size) for r in requests)


def build_summary(
    worker: str, metrics: dict[str, Any], tokens_per_s: float, latency: dict[str, Any], now: float
) -> dict[str, Any]:
    """The figures only: nothing that names a request (for the chat page, which any user may open), and
    cheap (no pass over the block pool)."""
    return {
        "type": "snapshot",
        "worker": worker,
        "time": now,
        "metrics": {k: v for k, v in metrics.items() if k not in ("block_map", "sequences")},
        "tokens_per_s": round(tokens_per_s, 2),
        "latency": latency,
    }


def with_block_map(summary: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The full snapshot: `summary` plus block map, block tables and the contiguous reservation.
    `metrics` must hold "block_map" and "sequences" (the engine's metrics(block_map=True)): both come from
    the same engine step, so tables and map agree."""
    requests = metrics["sequences"]
    return {
        **summary,
        "block_map": encode_block_map(metrics["block_map"]),
        "requests": requests,
        "contiguous_reserved_blocks": contiguous_reserved_blocks(requests, metrics["block_size"]),
    }
