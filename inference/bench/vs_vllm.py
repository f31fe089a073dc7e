"""Ours against vLLM's CPU backend, back to back in one run: the chat and shared-prefix workloads (output
tok/s) and the decode step at batch 32 with 128 and 1,024 tokens of context (issue 12's figures; the quick
mode uses smaller ones).

Each round runs ours first, then vLLM (one subprocess for all its tasks, so it compiles once); both get the same
prompts, arrival times, KV budget (raised to hold 32 x 1,024-token sequences) and threads. On a shared
machine only the ratios mean much, and each side's CPU seconds are reported beside the wall figures.
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import replace
from typing import Any

from inference.bench import roofline
from inference.bench.engines import ours, vllm_cpu
from inference.bench.engines.base import RunConfig
from inference.bench.workloads import Workload

DECODE_STEPS = 6
VLLM_CPU_BLOCK_MULTIPLE = 32  # vLLM 0.32's CPU attention: "No common block size for 16 (CPU_ATTN: MultipleOf(32))"


def decode_config(config: RunConfig, batch: int, contexts: tuple[int, ...]) -> RunConfig:
    """The shared budget, raised if needed to hold `batch` sequences at the longest context; the block size
    raised to the next multiple vLLM's CPU attention takes (both engines get it, so pages stay alike)."""
    block = -(-config.block_size // VLLM_CPU_BLOCK_MULTIPLE) * VLLM_CPU_BLOCK_MULTIPLE
    config = replace(config, block_size=block)
    need = batch * (max(contexts) + DECODE_STEPS + 8 + config.block_size)  # + what early ones decode in prefill
    need = -(-need // config.block_size) * config.block_size
    return replace(config, kv_budget_tokens=max(config.kv_budget_tokens, need))


def measure(workloads: dict[str, Workload], config: RunConfig, batch: int = 32,
            contexts: tuple[int, ...] = (128, 1024), rounds: int = 1, progress: bool = False) -> dict[str, Any]:
    """{"rounds": [{"ours", "vllm", "ratios"}, ...], "ratios": the median round's per figure, "ratios_min": the
    worst round's, ...}; "skipped" says why vLLM did not run (then each round holds ours alone).

    Each round runs ours, then vLLM: alternating them spreads the machine's drift over both, and the worst
    round says how robust a lead is."""
    config = decode_config(config, batch, contexts)
    out: dict[str, Any] = {"kv_budget_tokens": config.kv_budget_tokens, "block_size": config.block_size,
                           "dtype": config.dtype, "decode_batch": batch, "rounds": []}
    for _ in range(rounds):
        one = {"ours": run_ours(workloads, config, batch, contexts, progress)}
        out["rounds"].append(one)
        if not vllm_cpu.available():
            out["skipped"] = vllm_cpu.unavailable_reason()
            return out
        try:
            one["vllm"] = run_vllm(workloads, config, batch, contexts)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the rest of the run's figures still count
            out["skipped"] = f"vLLM failed: {exc}"
            return out
        one["ratios"] = ratios(one)
    out["ratios"] = {name: statistics.median(r["ratios"][name] for r in out["rounds"]) for name in one["ratios"]}
    out["ratios_min"] = {name: min(r["ratios"][name] for r in out["rounds"]) for name in one["ratios"]}
    return out


def run_ours(workloads: dict[str, Workload], config: RunConfig, batch: int, contexts: tuple[int, ...],
             progress: bool) -> dict[str, Any]:
    """One fresh engine through every workload, then the decode step at each context."""
    engine = ours.make_engine(config)
    figures = {name: ours.run(w, config, engine=engine, progress=progress).figures(config)
               for name, w in workloads.items()}
    for context in contexts:
        figures[f"decode_{context}"] = {"step_s": roofline.ours_decode_step_s(engine, batch, DECODE_STEPS, context)}
    return figures


def run_vllm(workloads: dict[str, Workload], config: RunConfig, batch: int, contexts: tuple[int, ...]) -> dict[str, Any]:
    """One vLLM subprocess for every task (it compiles once per process)."""
    tasks = [vllm_cpu.workload_task(name, w) for name, w in workloads.items()]
    tasks += [{"kind": "decode_step", "name": f"decode_{c}", "prompts": roofline.prompts(batch, c),
               "steps": DECODE_STEPS} for c in contexts]
    served = vllm_cpu.run_tasks(config, tasks)
    figures: dict[str, Any] = {"version": served["vllm_version"], "kv_blocks": served["kv_blocks"]}
    for name, workload in workloads.items():
        figures[name] = vllm_cpu.engine_run(workload, served[name], served["kv_blocks"], config).figures(config)
    for context in contexts:
        figures[f"decode_{context}"] = served[f"decode_{context}"]
    return figures


def ratios(one: dict[str, Any]) -> dict[str, float]:
    """Per workload ours/vLLM output tok/s (>= 1: ours faster); per context vLLM/ours step time (>= 1 likewise)."""
    result = {}
    for name, figures in one["ours"].items():
        theirs = one["vllm"][name]
        if "step_s" in figures:
            result[name] = theirs["step_s"] / figures["step_s"]
        else:
            result[name] = figures["output_tokens_per_s"] / theirs["output_tokens_per_s"]
    return result
