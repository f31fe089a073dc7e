"""The serving benchmark's arithmetic, and `python -m bench.serving` itself on a small workload (slow)."""
import json
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from bench.serving import clients as bench
from bench.serving.__main__ import empty_worker_cache
from playground.serving.shared import kv_feed, registry
from tests.playground.live_stack import ENGINE_ENV, REPO, PrivateRedis, free_port


class CharTokenizer:
    """Token id i decodes to VOCAB[i]; 0 is an end-of-sequence marker with no text."""

    VOCAB = {0: "", 1: "ab", 2: "c", 3: "de"}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.VOCAB[i] for i in ids)


def finished(token_ids, token_times):
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=token_ids)],
                           metrics=SimpleNamespace(token_times=token_times))


def test_each_token_is_timed_to_the_frame_that_completes_its_text():
    finals = {"r": finished([1, 2, 3, 0], [1.0, 2.0, 3.0, 3.5])}
    # Frames: "ab" at 1.25 (2 chars), "cde" at 3.5 (5 chars): token 2 waited for coalescing.
    results = [bench.Delivery("ws", "r", [(1.25, 2), (3.5, 5)], 4, "abcde")]
    assert bench.delivery_delays(results, finals, CharTokenizer()) == pytest.approx([0.25, 1.5, 0.5])


def test_a_run_s_seconds_are_split_by_the_engine_s_own_request_times():
    def request(arrival, token_times):
        return SimpleNamespace(metrics=SimpleNamespace(arrival_time=arrival, token_times=token_times))

    finals = [request(10.5, [11.0, 12.0]), request(10.2, [10.9, 13.5]), request(10.9, [])]
    assert bench.phases(10.0, 14.0, finals) == pytest.approx(
        {"to_first_arrival_s": 0.2, "arrival_spread_s": 0.7, "engine_span_s": 3.3, "after_last_token_s": 0.5})


def test_report_row():
    delays = {"ws": [0.01, 0.02, 0.03], "api": [0.04]}
    row = bench.report(2, 1, 8, bench.Run(100, 2.0), bench.Run(95, 2.0), delays, 30).splitlines()[-1]
    assert "| 2 | 1 | 8 | 50.0 (100 tok / 2.0 s) | 47.5 (95 tok / 2.0 s) | 95.0% |" in row
    assert "| 20.0 ms / 29.8 ms | 40.0 ms / 40.0 ms | 39.7 ms |" in row and row.endswith("| 30 ms |")


def test_delivered_texts_are_checked_against_the_engines():
    finals = {"a": SimpleNamespace(outputs=[SimpleNamespace(text="hello")]),
              "b": SimpleNamespace(outputs=[SimpleNamespace(text="world")])}
    results = [bench.Delivery("ws", "a", [], 1, "hello"), bench.Delivery("api", "b", [], 1, "worl")]
    assert bench.mismatched_texts(results, finals) == ["b"]


def test_without_the_engine_s_outputs_delivered_texts_are_checked_against_the_bare_run_s():
    bare, web = bench.Run(3, 1.0, texts=["a", "b", "c"]), bench.Run(3, 1.0, texts=["a", "x", "c"])
    assert bench.texts_unlike_bare(bare, web) == [1]
    with pytest.raises(ValueError):  # a chat missing from either run is not a match
        bench.texts_unlike_bare(bare, bench.Run(2, 1.0, texts=["a", "b"]))


def test_a_run_without_phases_still_reports_its_cpu_by_process():
    web = bench.Run(95, 2.0, cpu={"web": 1.0, "worker": 3.5, "redis": 0.25})
    lines = bench.report(2, 0, 8, bench.Run(100, 2.0), web, {}, 30).splitlines()
    assert lines[-1] == "web: CPU web 1.00 s, worker 3.50 s, redis 0.25 s"
    assert not any(line.startswith("bare") for line in lines)  # nothing measured, nothing printed


def test_a_distributed_web_run_starts_once_the_stack_s_worker_has_emptied_its_cache(monkeypatch):
    """The worker is asked to drop its cached blocks (the dashboard's control message, for it alone) and the
    run waits until its registry entry shows none; a worker that never does fails the bench by name."""
    asked: list[str] = []

    async def reset_prefix_cache(layer, worker):
        asked.append(worker)

    monkeypatch.setattr(kv_feed, "reset_prefix_cache", reset_prefix_cache)
    registry.beat({"name": "bench@h", "metrics": {"num_blocks_cached": 5}})
    returned = threading.Event()
    waiting = threading.Thread(target=lambda: (empty_worker_cache("bench@h"), returned.set()))
    waiting.start()
    time.sleep(0.3)
    assert asked == ["bench@h"] and not returned.is_set()
    registry.beat({"name": "bench@h", "metrics": {"num_blocks_cached": 0}})
    waiting.join(timeout=5)
    assert returned.is_set()
    with pytest.raises(RuntimeError, match="worker gone@h still reports cached blocks"):
        empty_worker_cache("gone@h", timeout_s=0.3)


def test_workload_prompts_are_distinct():
    chats = bench.workload(40)
    assert len({chat[0]["content"] for chat in chats}) == 40


@pytest.mark.slow
def test_serving_bench_streams_websocket_and_api_clients_at_once_and_checks_their_texts(tmp_path):
    """`python -m bench.serving` end to end, small: both kinds of clients complete with the engine's texts."""
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(ENGINE_ENV, PLAYGROUND_VAR_DIR=str(tmp_path))
    out = tmp_path / "serving.json"
    done = subprocess.run([sys.executable, "-m", "bench.serving", "--clients", "4", "--api-clients", "4",
                           "--max-tokens", "8", "--port", str(free_port()), "--rounds", "2", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("all 8 delivered texts equal the engine's") == 2
    row = done.stdout.strip().splitlines()[2]
    assert row.startswith("| 4 | 4 | 8 |")
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["order"] for r in rounds] == [["bare", "web"], ["web", "bare"]]  # alternating
    for r in rounds:
        assert r["bare"]["tokens"] == r["web"]["tokens"] > 0  # greedy: the same texts either way
        assert r["ratio"] == pytest.approx(r["web"]["tokens_per_s"] / r["bare"]["tokens_per_s"])
        assert r["web"]["ws_delay_p99_ms"] is not None and r["web"]["api_delay_p99_ms"] is not None
        for side in ("bare", "web"):  # the phases partition the run's seconds
            run = r[side]
            parts = run["to_first_arrival_s"] + run["engine_span_s"] + run["after_last_token_s"]
            assert parts == pytest.approx(run["seconds"], abs=0.01) and run["arrival_spread_s"] >= 0
            assert run["server_cpu_s"] > 0  # the engine computed in the server's process
        assert 0 <= r["web"]["clients_cpu_s"] < r["web"]["server_cpu_s"] and "clients_cpu_s" not in r["bare"]


@pytest.mark.slow
def test_serving_bench_on_the_distributed_stack_checks_texts_against_the_bare_engine(tmp_path):
    """`python -m bench.serving --stack distributed`, small: the web and worker processes serve over a Redis of
    the test's own, every delivered text equals the bare engine's, and the web run's CPU is counted per process."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    try:
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL", "SECRET_KEY"}}
        env.update(ENGINE_ENV, PLAYGROUND_VAR_DIR=str(tmp_path))
        out = tmp_path / "serving.json"
        done = subprocess.run([sys.executable, "-m", "bench.serving", "--stack", "distributed", "--redis-url",
                               redis.url, "--clients", "3", "--api-clients", "2", "--max-tokens", "8", "--port",
                               str(free_port()), "--rounds", "2", "--out", str(out)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    finally:
        redis.kill()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("all 5 delivered texts equal the bare engine's") == 2
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["order"] for r in rounds] == [["bare", "web"], ["web", "bare"]]
    for r in rounds:
        assert r["bare"]["tokens"] == r["web"]["tokens"] > 0
        assert r["bare"]["server_cpu_s"] > 0 and "server_cpu_s" not in r["web"]  # the bare engine is the bench's
        assert r["web"]["worker_cpu_s"] > 0 and r["web"]["web_cpu_s"] > 0 and r["web"]["redis_cpu_s"] >= 0
        assert "engine_span_s" not in r["web"] and r["web"]["ws_delay_p50_ms"] is None  # the worker's to know
