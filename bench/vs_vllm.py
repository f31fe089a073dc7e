"""Ours against vLLM's CPU backend, back to back in one run: the chat and shared-prefix workloads (output
tok/s) and the decode step at batch 32 with 128 and 1,024 tokens of context (issue 12's figures; the quick
mode uses smaller ones).

Each round starts a fresh engine of each (vLLM one subprocess, so it compiles once) and runs every task on both,
one right after the other: ours first in the first round, vLLM first in the next, and so on. A ratio then
compares two runs seconds apart rather than minutes (on these VMs an engine's own figures drift by a quarter
over minutes), and neither engine always runs first. A short task is repeated, the pairs alternating who goes
first, until each engine has spent about MIN_TASK_S on it, and each engine's median run stands for the round: a
1-3 s shared-prefix run or a few decode steps otherwise rests a round's ratio on one moment of a noisy machine.
Every workload run starts from an empty prefix cache on both engines (a repeat must not find its own prompts).
Both get the same prompts, arrival times, KV budget (raised to hold 32 x 1,024-token sequences) and threads. On a
shared machine only the ratios mean much, and each side's CPU seconds are reported beside the wall figures.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import time
from dataclasses import replace
from typing import Any

from inference import LLMEngine
from bench import roofline
from bench.engines import ours, vllm_cpu
from bench.engines.base import RunConfig
from bench.workloads import Workload

DECODE_STEPS = 6
MIN_TASK_S = 10.0  # seconds each engine spends on a task in a round, at least: short tasks are repeated
MAX_REPEATS = 5  # odd
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
    worst round's, ...}; "skipped" says why vLLM did not run (then the round holds ours alone).

    A round's tasks are the workloads, then the decode step at each context, on one engine of each; the worst
    round says how robust a lead is."""
    config = decode_config(config, batch, contexts)
    out: dict[str, Any] = {"kv_budget_tokens": config.kv_budget_tokens, "block_size": config.block_size,
                           "dtype": config.dtype, "decode_batch": batch, "rounds": []}
    tasks: dict[str, Workload | int] = {**workloads, **{f"decode_{c}": c for c in contexts}}
    for number in range(rounds):
        one: dict[str, Any] = {"ours": {}}
        out["rounds"].append(one)
        engine = ours.make_engine(config)
        if not vllm_cpu.available():
            out["skipped"] = vllm_cpu.unavailable_reason()
        else:
            try:
                with vllm_cpu.Session(config) as vllm:
                    one["vllm"] = {"version": vllm.info["vllm_version"], "kv_blocks": vllm.info["kv_blocks"]}
                    for name, task in tasks.items():
                        runs = repeated(engine, vllm, task, config, batch, number % 2 == 1, progress)
                        for side, figures_of_runs in runs.items():
                            one[side][name] = median_run(figures_of_runs)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the rest of the run's figures still count
                out["skipped"] = f"vLLM failed: {exc}"
                one.pop("vllm", None)
        if "skipped" in out:  # ours alone, every task
            one["ours"].update({name: figures(engine, task, config, batch, progress)
                                for name, task in tasks.items() if name not in one["ours"]})
            return out
        one["ratios"] = ratios(one)
    out["ratios"] = {name: statistics.median(r["ratios"][name] for r in out["rounds"]) for name in one["ratios"]}
    out["ratios_min"] = {name: min(r["ratios"][name] for r in out["rounds"]) for name in one["ratios"]}
    return out


def repeated(engine: LLMEngine, vllm: vllm_cpu.Session, task: Workload | int, config: RunConfig, batch: int,
             vllm_first: bool, progress: bool = False) -> dict[str, list[dict[str, Any]]]:
    """{"ours": [figures, ...], "vllm": [...]}: `task` on both engines back to back, repeated as the first pair's
    wall time says (until each engine has had about MIN_TASK_S; an odd number of pairs, at most MAX_REPEATS), the
    order of each pair swapped from the last."""
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "vllm": []}

    def pair(repeat: int) -> None:
        order = [("ours", engine), ("vllm", vllm)]
        for side, runner in reversed(order) if vllm_first ^ (repeat % 2 == 1) else order:
            runs[side].append(figures(runner, task, config, batch, progress))

    started = time.perf_counter()
    pair(0)
    needed = math.ceil(2 * MIN_TASK_S / max(time.perf_counter() - started, 1e-9))
    for repeat in range(1, min(MAX_REPEATS, needed // 2 * 2 + 1)):  # an odd count: the median is one of the runs
        pair(repeat)
    return runs


def headline(figures: dict[str, Any]) -> float:
    """What a task is judged by: output tok/s for a workload, the step's seconds for a decode step."""
    return figures["step_s"] if "step_s" in figures else figures["output_tokens_per_s"]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose headline figure is the median of `runs` (an odd number of them), with every run's headline
    figure beside it under "repeats"."""
    values = [headline(f) for f in runs]
    middle = sorted(range(len(runs)), key=values.__getitem__)[len(runs) // 2]
    return {**runs[middle], "repeats": values}


def figures(runner: LLMEngine | vllm_cpu.Session, task: Workload | int, config: RunConfig, batch: int,
            progress: bool = False) -> dict[str, Any]:
    """One task on one engine: a workload's figures, or the decode step's time at `task` tokens of context."""
    if isinstance(runner, vllm_cpu.Session):
        if isinstance(task, Workload):
            served = runner.run({**vllm_cpu.workload_task(task), "reset_prefix_cache": True})
            return vllm_cpu.engine_run(task, served, runner.info["kv_blocks"], config).figures(config)
        return runner.run({"kind": "decode_step", "prompts": roofline.prompts(batch, task), "steps": DECODE_STEPS})
    if isinstance(task, Workload):
        runner.reset_prefix_cache()
        return ours.run(task, config, engine=runner, progress=progress).figures(config)
    return {"step_s": roofline.ours_decode_step_s(runner, batch, DECODE_STEPS, task)}


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
