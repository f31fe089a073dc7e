"""What every engine adapter takes (`RunConfig`) and returns (`EngineRun`), and the arrival-time clock."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.kv import KVGeometry, KVTimeline
from bench.stats import RequestTiming, latency_figures
from bench.workloads import BenchRequest
from inference.model_loader import cache_dir


def peers_dir() -> Path:
    """Where the bench peers are installed (setup_vllm.sh, setup_llamacpp.sh): $PAGED_PLAYGROUND_PEERS, else
    `peers` in the converted models' cache folder."""
    return Path(os.environ.get("PAGED_PLAYGROUND_PEERS") or cache_dir() / "peers")


# Counters every engine reports; None (with a note) where an engine cannot expose one.
COUNTER_KEYS = ("num_preemptions", "prefix_cache_hit_rate", "prompt_tokens_computed", "max_concurrent_requests")


@dataclass(frozen=True)
class RunConfig:
    """The shared budget: every engine gets the same KV slots, sequence limit and model.

    `kv_budget_tokens=None` lets our engine size its pool itself (on CUDA by `gpu_memory_utilization`); the
    caller then sets the budget the peers get from the blocks it took (bench/gpu_suite.py).
    """

    model_path: Path
    geometry: KVGeometry
    block_size: int = 16
    kv_budget_tokens: int | None = 16384
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    seed: int = 0
    threads: int | None = None  # torch threads; None leaves torch's default
    dtype: str = "float32"  # weights, activations and KV of ours and the HF engines (llama.cpp keeps its GGUF)
    device: str = "cpu"  # where ours and the HF engines run; the other peers are CPU programs


@dataclass
class EngineRun:
    engine: str
    start: float
    timings: list[RequestTiming]
    kv: KVTimeline
    counters: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    cpu_s: float | None = None  # this process's CPU seconds during the run (all threads)

    def figures(self, config: RunConfig) -> dict[str, Any]:
        """The flat per-engine figures: latency and throughput, KV peak/average/utilisation, counters."""
        out = latency_figures(self.timings, self.start).as_dict()
        out.update(self.kv.summary(config.geometry, config.block_size))
        out["kv_budget_tokens"] = config.kv_budget_tokens
        out.update({key: self.counters.get(key) for key in COUNTER_KEYS})
        out["cpu_s"] = self.cpu_s
        # Tokens per CPU-second of this process: far less sensitive than wall time to other jobs sharing the cores.
        out["output_tokens_per_cpu_s"] = out["output_tokens"] / self.cpu_s if self.cpu_s else None
        out.update(self.extra)
        out["notes"] = list(self.notes)
        return out


class ArrivalClock:
    """Releases workload requests at their arrival times, measured from `start`."""

    def __init__(self, requests: list[BenchRequest]) -> None:
        self.pending = sorted(requests, key=lambda r: r.arrival_time)
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()

    def due(self) -> list[BenchRequest]:
        """Requests whose arrival time has passed (removed from the pending list)."""
        now = time.perf_counter() - self.start
        ready = [r for r in self.pending if r.arrival_time <= now]
        self.pending = self.pending[len(ready):]
        return ready

    def arrival(self, request: BenchRequest) -> float:
        """The absolute perf_counter time at which `request` arrived."""
        return self.start + request.arrival_time

    def cpu_seconds(self) -> float:
        """CPU time this process (every thread) used since the clock started."""
        return time.process_time() - self.cpu_start

    def wait_for_next(self) -> None:
        """Sleep until the next pending request arrives (used when the engine is idle)."""
        if self.pending:
            time.sleep(max(0.0, self.start + self.pending[0].arrival_time - time.perf_counter()))
