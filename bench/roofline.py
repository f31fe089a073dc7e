"""Roofline: how much of this machine's measured matmul FLOP/s our decode steps reach, per batch size.

A decode step does ~2 x parameters FLOPs per sequence (every weight is used in one multiply-add), so
`fraction = batch * 2 * params / step_time / peak`. The same measurement, turned into tokens/s per batch
size, is the throughput-vs-concurrency curve; HF `generate` is measured the same way beside it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from inference import LLMEngine, SamplingParams

BATCHES = (1, 8, 32, 64)
PROMPT_TOKENS = 32


def matmul_flops_per_s(n: int = 1536, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best-of-`repeats` n x n matmul rate in `dtype`: the machine's compute roof as torch can reach it."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # first call pays for thread-pool start-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def count_parameters(model_path: Path) -> int:
    """Parameters stored in the checkpoint (tied embeddings once: the LM head multiply reuses them)."""
    total = 0
    with safe_open(str(Path(model_path) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            total += _numel(f.get_slice(name).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out


def prompts(batch: int, length: int = PROMPT_TOKENS) -> list[list[int]]:
    """Distinct prompts of `length` tokens, so the prefix cache cannot merge them."""
    return [[1000 + (i * 7 + j) % 30000 for j in range(length)] for i in range(batch)]


def ours_decode_step_s(engine: LLMEngine, batch: int, steps: int, context: int = PROMPT_TOKENS) -> float:
    """Median wall time of a decode step with `batch` running sequences of ~`context` tokens (prefill excluded),
    after two warm-up steps: the same statistic the vLLM runner reports (bench/peers/vllm_runner.py).

    The first prompts prefilled start decoding while the rest are still prefilling, so every sequence may
    generate for as many steps as the prefill takes before the timing starts: max_tokens covers that, and
    each timed step is checked to run all `batch` sequences (a step of fewer would understate the cost).
    """
    prefill_steps = -(-batch * context // engine.scheduler.max_num_batched_tokens) + batch
    params = SamplingParams(temperature=0, max_tokens=prefill_steps + steps + 4, ignore_eos=True)
    ids = [f"roofline-{batch}-{i}" for i in range(batch)]
    for request_id, prompt in zip(ids, prompts(batch, context)):
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    started: set[str] = set()
    while len(started) < batch:  # prefill (possibly chunked) until every sequence has its first token
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    for _ in range(2):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        ran = len(engine.step())
        times.append(time.perf_counter() - start)
        if ran != batch:
            raise RuntimeError(f"a timed decode step ran {ran} sequences, not {batch}")
    for request_id in ids:
        engine.abort_request(request_id)
    return statistics.median(times)


def hf_decode_step_s(model: Any, batch: int, steps: int) -> float:
    """Mean wall time of an HF `generate` decode step at `batch` rows (the first, prefill, step excluded)."""
    from bench.engines.hf_static import generate_padded

    clock, _ = generate_padded(model, prompts(batch), steps + 1, model.config.pad_token_id or 0)
    return (clock.times[-1] - clock.times[0]) / steps


def measure(engine: LLMEngine, hf_model: Any | None, model_path: Path, batches: tuple[int, ...] = BATCHES,
            steps: int = 8) -> dict[str, Any]:
    """Peak FLOP/s, then per batch size: our and HF's decode tokens/s and our fraction of the roof."""
    peak = matmul_flops_per_s(dtype=engine.runner.dtype)
    flops_per_token = 2 * count_parameters(model_path)
    rows = []
    for batch in batches:
        step_s = ours_decode_step_s(engine, batch, steps)
        row = {
            "batch": batch,
            "ours_step_s": step_s,
            "ours_tokens_per_s": batch / step_s,
            "ours_fraction_of_roofline": batch * flops_per_token / step_s / peak,
        }
        if hf_model is not None:
            hf_step = hf_decode_step_s(hf_model, batch, steps)
            row.update({"hf_step_s": hf_step, "hf_tokens_per_s": batch / hf_step})
        rows.append(row)
    return {"matmul_flops_per_s": peak, "model_flops_per_token": flops_per_token, "decode": rows}
