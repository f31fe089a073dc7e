"""The side-by-side experiments of issues 4 and 8, each a pair of runs on one workload in one process.

- prefix caching on vs off on the shared-system-prompt workload (prompt tokens computed, TTFT p50);
- n=4 parallel sampling with shared prompt blocks vs the same samples as independent requests (peak blocks);
- beam width 4: blocks saved by sharing (skipped with a note while the engine has no beam search);
- the fixed KV budget: how many sequences each allocation policy holds, and the throughput that follows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from inference import LLM
from inference.bench import kv
from inference.bench.engines import ours
from inference.bench.engines.base import EngineRun, RunConfig
from inference.bench.workloads import Workload


def prefix_caching(workload: Workload, config: RunConfig, progress: bool = False) -> dict[str, Any]:
    """The same shared-prefix workload with caching on, then off (fresh engines, so nothing carries over)."""
    on = ours.run(workload, config, enable_prefix_caching=True, progress=progress)
    off = ours.run(workload, config, enable_prefix_caching=False, progress=progress)
    fig_on, fig_off = on.figures(config), off.figures(config)
    return {
        "on": fig_on,
        "off": fig_off,
        "prompt_tokens_computed_reduction": 1 - fig_on["prompt_tokens_computed"] / fig_off["prompt_tokens_computed"],
        "ttft_p50_speedup": fig_off["ttft_p50_s"] / fig_on["ttft_p50_s"],
    }


def parallel_sharing(workload: Workload, config: RunConfig, progress: bool = False) -> dict[str, Any]:
    """n=4 requests vs 4 independent copies of each; prefix caching off in both, so only forking shares."""
    shared = ours.run(workload, config, enable_prefix_caching=False, track_sharing=True, progress=progress)
    copies = [replace(r, request_id=f"{r.request_id}-copy{k}", n=1) for r in workload.requests for k in range(r.n)]
    unshared = ours.run(Workload(f"{workload.kind}-unshared", workload.seed, copies, workload.meta), config,
                        enable_prefix_caching=False, progress=progress)
    fig_shared, fig_unshared = shared.figures(config), unshared.figures(config)
    return {
        "shared": fig_shared,
        "unshared": fig_unshared,
        "peak_blocks_ratio": fig_shared["kv_peak_blocks"] / fig_unshared["kv_peak_blocks"],
    }


def beam_sharing(workload: Workload, config: RunConfig) -> dict[str, Any]:
    """Blocks saved by beams sharing their prefix; needs `LLM.beam_search`, which the engine may not have yet."""
    if not hasattr(LLM, "beam_search"):
        return {"skipped": "the engine has no beam search yet (issue 4); nothing to measure"}
    return {"skipped": "LLM.beam_search exists but the benchmark does not drive it yet"}


def fixed_budget(workload: Workload, config: RunConfig, runs: dict[str, EngineRun]) -> dict[str, Any]:
    """Sequences held at once under one KV budget: analytical capacity per policy, and what each engine did."""
    seq_lens = [r.num_prompt_tokens + r.max_tokens for r in workload.requests]
    capacity = kv.capacity(config.kv_budget_tokens, seq_lens, config.max_model_len, config.block_size)
    measured = {
        name: {
            "max_concurrent_requests": run.counters["max_concurrent_requests"],
            "output_tokens_per_s": run.figures(config)["output_tokens_per_s"],
        }
        for name, run in runs.items()
    }
    return {
        "kv_budget_tokens": config.kv_budget_tokens,
        "capacity": capacity,
        "paging_vs_max_length_prealloc": capacity["paging"] / max(capacity["max_length_prealloc"], 1),
        "measured": measured,
    }
