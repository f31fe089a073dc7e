"""HF transformers' own continuous batching (`generate_batch`'s manager and its paged cache).

We drive `continuous_batching_context_manager` directly rather than `generate_batch`, because only the manager
accepts requests one at a time (at their arrival times) with per-request `max_new_tokens`. It gets the same
KV budget as ours (`num_blocks` pages of `page_size` = our block size), sequence limit and token budget.
Its KV use is reconstructed from each request's admission time and token timestamps (pages of
`ceil(context / page_size)`); prefix sharing between requests is not credited, which only matters for
workloads with shared prompts.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm
from transformers import GenerationConfig, GenerationMixin
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from bench.engines import hf_static
from bench.engines.base import ArrivalClock, EngineRun, RunConfig
from bench.kv import SequenceSpan, paged_timeline
from bench.stats import RequestTiming
from bench.workloads import Workload

NAME = "hf_continuous"
NO_EOS = -1  # the manager's value for "never stop at EOS"


def available() -> bool:
    """Whether this transformers version has continuous batching (it arrived with `generate_batch`)."""
    return hasattr(GenerationMixin, "continuous_batching_context_manager")


def run(workload: Workload, config: RunConfig, model: Any | None = None, progress: bool = False) -> EngineRun:
    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the HF continuous-batching peer runs single-sample workloads only")
    model = model or hf_static.load_model(config)
    if not available():
        raise RuntimeError("this transformers version has no continuous batching (generate_batch)")
    gen = GenerationConfig(do_sample=False, eos_token_id=NO_EOS, pad_token_id=model.config.pad_token_id)
    cb = ContinuousBatchingConfig(
        page_size=config.block_size, num_blocks=config.kv_budget_tokens // config.block_size,
        max_batch_tokens=config.max_num_batched_tokens, max_requests_per_batch=config.max_num_seqs,
    )
    results: dict[str, Any] = {}
    arrivals: dict[str, float] = {}
    bar = tqdm(total=workload.total_output_tokens, desc=f"{NAME}:{workload.kind}", unit="tok",
               disable=not progress, leave=False)
    # timeout: if a request fails, leaving the block must not wait for the manager to finish every other one.
    with model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb,
                                                   warmup=False, timeout=10) as manager:
        _warm_up(manager)
        clock = ArrivalClock(workload.requests)
        while clock.pending:
            for request in clock.due():
                arrivals[request.request_id] = clock.arrival(request)
                manager.add_request(request.prompt_token_ids, request_id=request.request_id,
                                    max_new_tokens=request.max_tokens, record_timestamps=True, eos_token_id=NO_EOS)
            _drain(manager, results, bar)
            clock.wait_for_next()
        while len(results) < len(workload.requests):
            # No result for a while is normal (a long prefill of many prompts); a dead loop is not.
            if not _drain(manager, results, bar, timeout=1.0) and not manager.is_running():
                raise RuntimeError(f"HF continuous batching stopped with {len(results)} of "
                                   f"{len(workload.requests)} requests finished")
        cpu_s = clock.cpu_seconds()
    bar.close()
    prompt_lens = {r.request_id: r.num_prompt_tokens for r in workload.requests}
    timings, spans = [], []
    for rid, out in results.items():
        if out.error:
            raise RuntimeError(f"HF continuous batching failed request {rid}: {out.error}")
        timings.append(RequestTiming(f"{rid}#0", arrivals[rid], prompt_lens[rid], list(out.timestamps)))
        spans.append(SequenceSpan(out.lifespan[0], prompt_lens[rid], list(out.timestamps)))
    timeline = paged_timeline(spans, config.block_size)
    counters = {
        "num_preemptions": None,
        "prefix_cache_hit_rate": None,
        "prompt_tokens_computed": sum(prompt_lens.values()),
        "max_concurrent_requests": _max_overlap(spans),
    }
    notes = ["HF CB exposes no preemption or prefix-cache counters (reported as null); prompt tokens "
             "computed counts whole prompts; KV reconstructed from admission and token times"]
    return EngineRun(NAME, clock.start, timings, timeline, counters, notes, cpu_s=cpu_s)


def _drain(manager: Any, results: dict[str, Any], bar: tqdm | None, timeout: float = 0.0) -> bool:
    """Move finished results from the manager's queue into `results`; True if any arrived."""
    got = False
    while True:
        out = manager.get_result(timeout=timeout if not got else 0.0)
        if out is None:
            return got
        if out.is_finished():
            results[out.request_id] = out
            got = True
            if bar is not None:
                bar.update(len(out.generated_tokens))


def _warm_up(manager: Any) -> None:
    """One short request before the timed run, so one-off setup stays out of the timings."""
    manager.add_request(list(range(1000, 1040)), request_id="warmup", max_new_tokens=4, eos_token_id=NO_EOS)
    warm: dict[str, Any] = {}
    while not warm:
        if not _drain(manager, warm, bar=None, timeout=1.0) and not manager.is_running():
            raise RuntimeError("HF continuous batching stopped during its warm-up request")


def _max_overlap(spans: list[SequenceSpan]) -> int:
    """Most sequences admitted and not yet finished at any one time."""
    events = sorted([(s.start, 1) for s in spans] + [(s.last, -1) for s in spans])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak
