"""The seeds' baseline: HF transformers `generate` in static padded batches with a contiguous cache.

The batch size is what the shared KV budget allows when every row reserves contiguous room for the longest
sequence it may become, since a static server cannot know its batch's lengths in advance. Two reservations
are measured, as two engines:

- `hf_static`: each row reserves the workload's longest padded row (`longest prompt + longest max_tokens`),
  the most generous sizing a server that knows its whole workload could choose;
- `hf_static_maxlen`: each row reserves `max_model_len`, the seeds' description of contiguous allocation
  (the cache of a sequence is pre-allocated for the longest sequence the model accepts).

Both run the same `generate` calls; only the rows per batch differ. Each batch is left-padded to its longest prompt and runs until its longest output is done;
rows that asked for fewer tokens keep computing (their extra tokens are discarded and not counted). A batch
starts when the previous one returns, with whatever requests have arrived by then.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, GenerationConfig, StoppingCriteria, StoppingCriteriaList

from bench.engines.base import ArrivalClock, EngineRun, RunConfig
from bench.kv import StaticBatch, contiguous_timeline
from bench.stats import RequestTiming
from bench.workloads import BenchRequest, Workload

NAME = "hf_static"
MAXLEN_NAME = "hf_static_maxlen"


class StepClock(StoppingCriteria):
    """Never stops generation; records when each new token of the batch was produced."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def load_model(config: RunConfig) -> Any:
    model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=getattr(torch, config.dtype))
    return model.to(config.device).eval()


def reserved_row_len(workload: Workload, config: RunConfig, max_length: bool = False) -> int:
    """Token slots each row reserves: `max_model_len`, or the workload's longest padded row."""
    return config.max_model_len if max_length else workload.padded_row_len


def static_batch_size(workload: Workload, config: RunConfig, max_length: bool = False) -> int:
    """How many reserved rows fit in the KV budget (at least 1)."""
    return max(1, config.kv_budget_tokens // reserved_row_len(workload, config, max_length))


def generate_padded(model: Any, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> tuple[StepClock, int]:
    """Greedy `generate` over left-padded prompts with EOS ignored; returns the step clock and padded length."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    clock = StepClock()
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=pad_id)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, generation_config=gen, stopping_criteria=StoppingCriteriaList([clock]))
    return clock, width


def run_max_length(workload: Workload, config: RunConfig, progress: bool = False) -> EngineRun:
    """The same baseline with every row reserving `max_model_len` (the seeds' contiguous allocation)."""
    return run(workload, config, progress=progress, max_length=True)


def run(workload: Workload, config: RunConfig, model: Any | None = None, progress: bool = False,
        max_length: bool = False) -> EngineRun:
    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the HF static baseline runs single-sample workloads only")
    model = model or load_model(config)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    generate_padded(model, [list(range(1000, 1040))], 4, pad_id)  # warm-up, outside the timings
    name = MAXLEN_NAME if max_length else NAME
    row_len = reserved_row_len(workload, config, max_length)
    batch_size = static_batch_size(workload, config, max_length)
    clock = ArrivalClock(workload.requests)
    queue: list[BenchRequest] = []
    timings: list[RequestTiming] = []
    batches: list[StaticBatch] = []
    computed_prompt = wasted_tokens = 0
    bar = tqdm(total=workload.total_output_tokens, desc=f"{name}:{workload.kind}", unit="tok",
               disable=not progress, leave=False)
    while clock.pending or queue:
        queue.extend(clock.due())
        if not queue:
            clock.wait_for_next()
            continue
        batch, queue = queue[:batch_size], queue[batch_size:]
        longest = max(r.max_tokens for r in batch)
        start = time.perf_counter()
        steps, width = generate_padded(model, [r.prompt_token_ids for r in batch], longest, pad_id)
        batches.append(StaticBatch(start, time.perf_counter(), steps.times,
                                   [r.num_prompt_tokens for r in batch], [r.max_tokens for r in batch]))
        for r in batch:
            timings.append(RequestTiming(f"{r.request_id}#0", clock.arrival(r), r.num_prompt_tokens,
                                         steps.times[: r.max_tokens]))
        computed_prompt += width * len(batch)
        wasted_tokens += sum(longest - r.max_tokens for r in batch)
        bar.update(sum(r.max_tokens for r in batch))
    cpu_s = clock.cpu_seconds()
    bar.close()
    prealloc = contiguous_timeline(batches, reserve_len=row_len)
    counters = {
        "num_preemptions": 0,  # a static batch never over-admits, so it never preempts
        "prefix_cache_hit_rate": 0.0,  # no prefix cache
        "prompt_tokens_computed": computed_prompt,  # pads included: they go through the model too
        "max_concurrent_requests": max(len(b.prompt_lens) for b in batches),
    }
    extra = {
        "batch_size": batch_size,
        "num_batches": len(batches),
        "wasted_decode_tokens": wasted_tokens,
        "kv_slot_utilization_avg_prealloc": prealloc.summary(config.geometry, config.block_size)["kv_slot_utilization_avg"],
    }
    notes = [f"static batches of {batch_size} = KV budget {config.kv_budget_tokens} // reserved row {row_len} "
             f"({'max_model_len' if max_length else 'longest padded row'}); KV figures reconstructed from the "
             f"padded cache layout and token times"]
    return EngineRun(name, clock.start, timings, contiguous_timeline(batches), counters, notes, extra, cpu_s)
