"""`/metrics`: every live worker's heartbeat as Prometheus text under vLLM's names, one series per worker.

The real engine's figures are checked against `/metrics` in test_dashboard_engine.py; here the heartbeats
are written by hand to check the exposition itself: parsing, labels, counters, histograms, several workers.
"""
import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from playground.celery import app as celery_app
from playground.dashboard.prometheus import COUNTERS, GAUGES, HISTOGRAMS
from playground.serving.worker.stats import LatencyStats
from playground.serving.shared import registry
from playground.serving.shared.naming import GPU_QUEUE, TASK_NAME, worker_queue

REPO = Path(__file__).resolve().parents[2]


class Times:
    def __init__(self, arrival: float, tokens: list[float], queued_s: float = 0.0) -> None:
        self.arrival_time, self.first_token_time, self.finished_time = arrival, tokens[0], tokens[-1]
        self.first_scheduled_time, self.last_token_time = arrival + queued_s, tokens[-1]
        self.token_times = tokens


def engine_metrics(scale: int) -> dict:
    """Figures in the shape of the engine's metrics() (without the block map), distinct per worker."""
    return {
        "block_size": 16, "num_blocks_total": 100 * scale, "num_blocks_used": 10 * scale,
        "num_blocks_free": 85 * scale, "num_blocks_cached": 5 * scale, "num_blocks_shared": 2 * scale,
        "kv_cache_usage": 0.1, "kv_slot_utilization": 0.875, "num_requests_running": 3 * scale,
        "num_requests_waiting": scale, "num_preemptions_total": 7 * scale, "prompt_tokens_total": 1000 * scale,
        "generation_tokens_total": 500 * scale, "prefix_cache_queries_total": 800 * scale,
        "prefix_cache_hits_total": 320 * scale, "prefix_cache_hit_rate": 0.4, "evictions_total": 4 * scale,
        "cow_copies_total": 6 * scale, "weight_bytes": 94_000_000 * scale, "kv_pool_bytes": 48_000_000 * scale,
        "tensor_parallel_size": 2 * scale, "weight_bytes_per_rank": 47_000_000, "kv_pool_bytes_per_rank": 24_000_000,
        "kv_bytes_per_token": 23_040 * scale, "quantization": "int4",
    }


def beat(name: str, scale: int, latency: LatencyStats, state: str = "ready") -> dict:
    heartbeat = {"name": name, "state": state, "model": "smollm2-135m-instruct",
                 "metrics": engine_metrics(scale) if state == "ready" else {}, "latency": latency.export()}
    registry.beat(heartbeat)
    return heartbeat


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(response.content.decode())}


def values(family, sample_name: str) -> dict:
    """{worker: value} of one sample name of a family."""
    return {s.labels["worker"]: s.value for s in family.samples if s.name == sample_name}


def test_every_live_worker_appears_with_its_figures_under_vllm_names(client):
    one, two = LatencyStats(), LatencyStats()
    one.observe(Times(0.0, [0.05, 0.07, 0.10]))
    one.observe(Times(10.0, [10.3, 10.32]))
    beat("w1@a", 1, one)
    beat("w2@b", 2, two)
    beat("w3@c", 1, LatencyStats(), state="loading")  # no figures yet: left out
    families = scrape(client)

    for name, _, key in GAUGES:
        assert families[name].type == "gauge"
        assert values(families[name], name) == {"w1@a": engine_metrics(1)[key], "w2@b": engine_metrics(2)[key]}
    for name, _, key in COUNTERS:
        assert families[name].type == "counter"
        assert values(families[name], name + "_total") == {
            "w1@a": engine_metrics(1)[key], "w2@b": engine_metrics(2)[key]
        }
    sample = families["vllm:num_requests_running"].samples[0]
    assert sample.labels == {"worker": "w1@a", "model_name": "smollm2-135m-instruct"}

    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    assert values(ttft, "vllm:time_to_first_token_seconds_count") == {"w1@a": 2, "w2@b": 0}
    assert values(ttft, "vllm:time_to_first_token_seconds_sum")["w1@a"] == pytest.approx(0.35)
    buckets = {s.labels["le"]: s.value for s in ttft.samples
               if s.name.endswith("_bucket") and s.labels["worker"] == "w1@a"}
    assert buckets["0.04"] == 0 and buckets["0.06"] == 1 and buckets["0.25"] == 1 and buckets["0.5"] == 2
    assert buckets["+Inf"] == 2
    itl = families["vllm:inter_token_latency_seconds"]
    assert values(itl, "vllm:inter_token_latency_seconds_count") == {"w1@a": 3, "w2@b": 0}
    e2e = families["vllm:e2e_request_latency_seconds"]
    assert values(e2e, "vllm:e2e_request_latency_seconds_sum")["w1@a"] == pytest.approx(0.42)
    assert {name for name, _, _ in HISTOGRAMS} <= set(families)


def test_a_dead_worker_drops_out_and_no_worker_means_empty_families(client):
    beat("w1@a", 1, LatencyStats())
    registry.forget("w1@a")
    families = scrape(client)
    assert families["vllm:num_requests_running"].samples == []
    assert families["vllm:time_to_first_token_seconds"].samples == []


def test_metrics_is_plain_get(client):
    assert client.post("/metrics").status_code == 405


def test_grafana_dashboard_queries_only_metrics_that_metrics_exposes():
    """docs/grafana-dashboard.json must not chart a name /metrics never serves (a typo shows an empty panel)."""
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exposed = {name for name, _, _ in GAUGES + HISTOGRAMS} | {name + "_total" for name, _, _ in COUNTERS}
    exposed |= {name + "_bucket" for name, _, _ in HISTOGRAMS}
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            queried |= set(re.findall(r"\b((?:vllm|playground):[a-z0-9_]+)", target["expr"]))
    assert queried and queried <= exposed, queried - exposed
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "model_name", "worker"}


def test_request_phases_finish_reasons_and_queue_backlog_under_vllm_names(client):
    stats = LatencyStats()
    stats.observe(Times(0.0, [0.5, 0.6, 1.5], queued_s=0.2))  # queue 0.2 s, prefill 0.3 s, decode 1.0 s
    stats.observe(Times(5.0, [6.0, 6.2], queued_s=0.9))  # queue 0.9 s, prefill 0.1 s, decode 0.2 s
    stats.count_finished(["stop"])
    stats.count_finished(["length", "length"])
    registry.beat({**beat("w1@a", 1, stats), "queue": worker_queue("w1@a"), "finished": stats.finish_reasons()})
    celery_app.send_task(TASK_NAME, kwargs={}, queue=GPU_QUEUE)  # no worker consumes it in this test
    celery_app.send_task(TASK_NAME, kwargs={}, queue=GPU_QUEUE)
    try:
        families = scrape(client)
    finally:
        with celery_app.connection_for_write() as connection:
            connection.default_channel.queue_purge(GPU_QUEUE)
    for name, count, total in (("vllm:request_queue_time_seconds", 2, 1.1),
                               ("vllm:request_prefill_time_seconds", 2, 0.4),
                               ("vllm:request_decode_time_seconds", 2, 1.2)):
        assert families[name].type == "histogram"
        assert values(families[name], name + "_count") == {"w1@a": count}
        assert values(families[name], name + "_sum")["w1@a"] == pytest.approx(total)
    success = families["vllm:request_success"]
    assert success.type == "counter"
    assert {s.labels["finished_reason"]: s.value for s in success.samples} == {"stop": 1, "length": 2}
    backlog = families["playground:queue_backlog"]
    assert {s.labels["queue"]: s.value for s in backlog.samples} == {GPU_QUEUE: 2, worker_queue("w1@a"): 0}
