"""The side-by-side experiments of issues 4 and 8, each a pair of runs on one workload in one process.

- prefix caching on vs off on the shared-system-prompt workload (prompt tokens computed, TTFT p50);
- n=4 parallel sampling with shared prompt blocks vs the same samples as independent requests (peak blocks);
- beam width 4: blocks saved by beams sharing their blocks;
- the fixed KV budget: how many sequences each allocation policy holds, and the throughput that follows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from inference import BeamSearchParams
from bench import kv
from bench.engines import ours
from bench.engines.base import EngineRun, RunConfig
from bench.workloads import Workload


def prefix_caching(workload: Workload, config: RunConfig, progress: bool = False) -> dict[str, Any]:
    """The same shared-prefix workload with caching on, then off (fresh engines, so nothing carries over)."""
    on = ours.run(workload, config, enable_prefix_caching=True, progress=progress)
    off = ours.run(workload, config, enable_prefix_caching=False, progress=progress)
    fig_on, fig_off = on.figures(config), off.figures(config)
    return {
        "on": fig_on,
        "off": fig_off,
        "shared_prefix_tokens": _common_prefix_len([r.prompt_token_ids for r in workload.requests]),
        "prompt_tokens_computed_reduction": 1 - fig_on["prompt_tokens_computed"] / fig_off["prompt_tokens_computed"],
        "ideal_reduction": _ideal_reduction(workload, config.block_size),
        "ttft_p50_speedup": fig_off["ttft_p50_s"] / fig_on["ttft_p50_s"],
    }


def _common_prefix_len(prompts: list[list[int]]) -> int:
    first = prompts[0]
    for i, token in enumerate(first):
        if any(i >= len(p) or p[i] != token for p in prompts[1:]):
            return i
    return len(first)


def _ideal_reduction(workload: Workload, block_size: int) -> float:
    """What reusing the shared system prompt alone can save: every request after the first reuses the common
    prefix's full blocks (a prompt's last token is always computed), so the suffixes' share bounds it."""
    prompts = [r.prompt_token_ids for r in workload.requests]
    reusable = min(_common_prefix_len(prompts), min(len(p) for p in prompts) - 1) // block_size * block_size
    return reusable * (len(prompts) - 1) / sum(len(p) for p in prompts)


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
    """Beam search on shared blocks: blocks used vs what the same beams would hold without sharing.

    Without sharing every beam would own a copy of each block in its table, i.e. the sum of the ref counts;
    the engine holds each such block once. Both are read from the block map after every step. Prefix caching
    is off so only the beams' forking shares blocks.
    """
    engine = ours.make_engine(config, enable_prefix_caching=False)
    for request in workload.requests:
        params = BeamSearchParams(beam_width=request.beam_width, max_tokens=request.max_tokens, ignore_eos=True)
        engine.add_beam_search(request.request_id, {"prompt_token_ids": request.prompt_token_ids}, params)
    peak_used = peak_unshared = used_area = unshared_area = 0
    while engine.has_unfinished_requests():
        engine.step()
        m = engine.metrics(block_map=True)
        used, unshared = m["num_blocks_used"], sum(b["ref_count"] for b in m["block_map"])
        peak_used, peak_unshared = max(peak_used, used), max(peak_unshared, unshared)
        used_area, unshared_area = used_area + used, unshared_area + unshared
    return {
        "beam_width": max(r.beam_width for r in workload.requests),
        "num_requests": len(workload.requests),
        "peak_blocks_shared": peak_used,
        "peak_blocks_unshared": peak_unshared,
        "blocks_saved_at_peak": 1 - peak_used / peak_unshared,
        "blocks_saved_avg": 1 - used_area / unshared_area,
    }


def fixed_budget(workload: Workload, config: RunConfig, runs: dict[str, EngineRun]) -> dict[str, Any]:
    """Sequences held at once under one KV budget: analytical capacity per policy, and what each engine did."""
    seq_lens = [r.num_prompt_tokens + r.max_tokens for r in workload.requests]
    capacity = kv.capacity(config.kv_budget_tokens, seq_lens, workload.padded_row_len, config.max_model_len,
                           config.block_size)
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
