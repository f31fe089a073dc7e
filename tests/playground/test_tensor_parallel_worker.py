"""A GPU worker under PLAYGROUND_TENSOR_PARALLEL_SIZE: the setting reaches its engine, its heartbeat carries N
and the per-rank bytes, and a rank that dies turns the worker unhealthy (so it stops taking tasks)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from playground.serving.shared.envelope import Job
from playground.serving.worker.bridge import LoopBridge
from playground.serving.worker.engine_service import EngineService, EngineUnavailable
from playground.serving.worker.runtime import WorkerRuntime
from tests.inference.tiny_models import SHAPE, save_tiny

REPO = Path(__file__).resolve().parents[2]


def engine_setting(**env: str) -> subprocess.CompletedProcess:
    code = "import playground.settings as s; print(s.PLAYGROUND_ENGINE['tensor_parallel_size'])"
    environ = {k: v for k, v in os.environ.items() if k != "PLAYGROUND_TENSOR_PARALLEL_SIZE"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**environ, "SECRET_KEY": "test-only", **env},
                          capture_output=True, text=True, timeout=60)


def test_the_setting_reaches_the_worker_engine():
    assert engine_setting().stdout.strip() == "1"
    assert engine_setting(PLAYGROUND_TENSOR_PARALLEL_SIZE="3").stdout.strip() == "3"
    refused = engine_setting(PLAYGROUND_TENSOR_PARALLEL_SIZE="0")
    assert refused.returncode != 0 and "PLAYGROUND_TENSOR_PARALLEL_SIZE" in refused.stderr


@pytest.mark.slow
def test_a_dead_rank_turns_the_heartbeat_unhealthy(tmp_path):
    save_tiny(tmp_path, LlamaForCausalLM, LlamaConfig(**SHAPE))
    service = EngineService({"model": str(tmp_path), "tensor_parallel_size": 2, "num_kv_blocks": 64,
                             "max_model_len": 256})
    service.load()
    bridge = LoopBridge()
    bridge.start()
    runtime = WorkerRuntime("tp@test", service, bridge)
    try:
        beat = runtime.heartbeat()
        assert beat["state"] == "ready", beat["health"]
        figures = beat["metrics"]
        assert figures["tensor_parallel_size"] == 2
        assert figures["kv_pool_bytes"] == 2 * figures["kv_pool_bytes_per_rank"] > 0
        os.kill(service.wait_ready(0).engine.runner.ranks.pids[0], signal.SIGKILL)  # while idle
        deadline = time.monotonic() + 5
        while runtime.heartbeat()["state"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        beat = runtime.heartbeat()
        assert beat["state"] == "failed" and "tensor-parallel rank 1" in beat["health"]["error"]
        with pytest.raises(EngineUnavailable, match="rank 1"):
            service.submit("after-the-fault", Job({"max_tokens": 4}, prompt="Hi"))
    finally:
        service.shutdown()
        bridge.stop()
