"""Our engine, driven step by step through `LLMEngine` so arrivals, token times and KV use are all observed.

Requests are added at their arrival times; after every `step()` the adapter stamps each new token with the
time and samples `metrics()` (block usage and `kv_slot_utilization`), so the KV figures are the engine's own
accounting, not a model of it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from tqdm import tqdm

from inference import LLM, LLMEngine, SamplingParams
from bench.engines.base import ArrivalClock, EngineRun, RunConfig
from bench.kv import KVSample, KVTimeline
from bench.stats import RequestTiming
from bench.workloads import BenchRequest, Workload

NAME = "ours"
# Counters that grow over the engine's life; the adapter reports their growth during the timed run only.
_CUMULATIVE = ("num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
               "prompt_tokens_total", "cow_copies_total")


def make_engine(config: RunConfig, enable_prefix_caching: bool = True,
                quantization: str | None = None) -> LLMEngine:
    """An engine with exactly the shared KV budget (kv_budget_tokens / block_size blocks; with no budget, the
    blocks `gpu_memory_utilization` allows), warmed up."""
    blocks = None if config.kv_budget_tokens is None else config.kv_budget_tokens // config.block_size
    llm = LLM(quantization=quantization,
        model=str(config.model_path), device=config.device, dtype=config.dtype, block_size=config.block_size,
        num_kv_blocks=blocks, max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching, seed=config.seed,
    )
    engine = llm.llm_engine
    # One short request first, so one-off costs (allocator, kernels' first call) stay out of the timings.
    engine.add_request("warmup", {"prompt_token_ids": list(range(1000, 1040))},
                       SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return engine


def sampling_params(request: BenchRequest, seed: int) -> SamplingParams:
    """Exactly max_tokens tokens; greedy for one sample, seeded sampling for n > 1 (so samples differ)."""
    if request.n > 1:
        return SamplingParams(n=request.n, temperature=0.8, seed=seed, max_tokens=request.max_tokens,
                              ignore_eos=True)
    return SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=True)


def run(
    workload: Workload,
    config: RunConfig,
    enable_prefix_caching: bool = True,
    track_sharing: bool = False,
    engine: LLMEngine | None = None,
    progress: bool = False,
) -> EngineRun:
    """Serve `workload` on our engine; `track_sharing` also samples the block map (ref counts) every step."""
    if any(r.beam_width > 1 for r in workload.requests):
        raise ValueError("beam requests go through bench.experiments.beam_sharing, not run()")
    engine = engine or make_engine(config, enable_prefix_caching)
    base = engine.metrics(block_map=False)
    bs = config.block_size
    arrivals: dict[str, float] = {}
    token_times: dict[tuple[str, int], list[float]] = defaultdict(list)
    samples: list[KVSample] = []
    peak_unshared_blocks = peak_requests = 0
    bar = tqdm(total=workload.total_output_tokens, desc=f"{NAME}:{workload.kind}", unit="tok",
               disable=not progress, leave=False)
    clock = ArrivalClock(workload.requests)
    while clock.pending or engine.has_unfinished_requests():
        for request in clock.due():
            arrivals[request.request_id] = clock.arrival(request)
            engine.add_request(request.request_id, {"prompt_token_ids": request.prompt_token_ids},
                               sampling_params(request, config.seed), arrival_time=arrivals[request.request_id])
        if not engine.has_unfinished_requests():
            clock.wait_for_next()
            continue
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            for completion in output.outputs:
                times = token_times[(output.request_id, completion.index)]
                new = len(completion.token_ids) - len(times)
                times.extend([now] * new)
                bar.update(new)
        m = engine.metrics(block_map=track_sharing)
        used = m["num_blocks_used"] * bs
        samples.append(KVSample(now, used, round(m["kv_slot_utilization"] * used)))
        peak_requests = max(peak_requests, m["num_requests_running"])
        if track_sharing:
            peak_unshared_blocks = max(peak_unshared_blocks, sum(b["ref_count"] for b in m["block_map"]))
    cpu_s = clock.cpu_seconds()
    bar.close()
    final = engine.metrics(block_map=False)
    grown = {key: final[key] - base[key] for key in _CUMULATIVE}
    prompt_lens = {r.request_id: r.num_prompt_tokens for r in workload.requests}
    timings = [
        RequestTiming(f"{rid}#{index}", arrivals[rid], prompt_lens[rid], times)
        for (rid, index), times in sorted(token_times.items())
    ]
    counters: dict[str, Any] = {
        "num_preemptions": grown["num_preemptions_total"],
        "prefix_cache_hit_rate": (grown["prefix_cache_hits_total"] / grown["prefix_cache_queries_total"]
                                  if grown["prefix_cache_queries_total"] else 0.0),
        "prompt_tokens_computed": grown["prompt_tokens_total"],
        "max_concurrent_requests": peak_requests,
    }
    extra: dict[str, Any] = {"prefix_cache_enabled": enable_prefix_caching, "cow_copies": grown["cow_copies_total"]}
    if track_sharing:
        extra["kv_peak_blocks_unshared"] = peak_unshared_blocks
    return EngineRun(NAME, clock.start, timings, KVTimeline(samples, end=max(samples[-1].time, clock.start)),
                     counters, extra=extra, cpu_s=cpu_s)
