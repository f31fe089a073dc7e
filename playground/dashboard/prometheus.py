"""Prometheus exposition of every live GPU worker's figures, from the web process.

The web process cannot read a worker's memory, and workers run no HTTP server. But every worker already
writes a heartbeat to the shared cache each second (playground/serving/shared/registry.py) holding its engine's
`metrics()` (without the block map) and its latency histograms. So `/metrics` on any web server renders the
latest heartbeat of each live worker, one time series per worker (label `worker`), under vLLM's metric
names wherever vLLM has one (docs/metrics.md), so vLLM's Grafana dashboards work unchanged. A worker that
dies drops out within the heartbeat TTL; its counters restart from zero with the next process, which
Prometheus' rate() treats as a counter reset.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

LABELS = ["worker", "model_name"]

# (metric name, help, key of the engine's metrics()).
GAUGES = [
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "num_requests_running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "num_requests_waiting"),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
    ("vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (pre-v1 vLLM name).", "kv_cache_usage"),
    ("playground:kv_slot_utilization", "Filled share of the token slots of the blocks in use (0 to 1).",
     "kv_slot_utilization"),
    ("playground:num_blocks_total", "Physical KV blocks in the pool.", "num_blocks_total"),
    ("playground:num_blocks_used", "Physical KV blocks held by at least one sequence.", "num_blocks_used"),
    ("playground:num_blocks_shared", "Physical KV blocks held by more than one sequence.", "num_blocks_shared"),
    ("playground:num_blocks_cached", "Unreferenced blocks kept for prefix-cache hits (evictable).",
     "num_blocks_cached"),
    ("playground:num_blocks_free", "Physical KV blocks neither used nor cached.", "num_blocks_free"),
    ("playground:weight_bytes", "Resident bytes of the model's weights (smaller when quantized).", "weight_bytes"),
    ("playground:kv_pool_bytes", "Bytes of the KV block pool.", "kv_pool_bytes"),
    ("playground:kv_bytes_per_token", "KV-cache bytes one token takes across all layers (a latent per token with "
     "latent attention, a key and a value per KV head otherwise).", "kv_bytes_per_token"),
    ("playground:tensor_parallel_size", "Devices (ranks) the model is split over.", "tensor_parallel_size"),
    ("playground:weight_bytes_per_rank", "Resident bytes of one rank's shard of the weights.", "weight_bytes_per_rank"),
    ("playground:kv_pool_bytes_per_rank", "Bytes of one rank's share of the KV pool (kv_heads / N of each block).",
     "kv_pool_bytes_per_rank"),
]

# Counters: the exposed sample is the name plus "_total".
COUNTERS = [
    ("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", "num_preemptions_total"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_total"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens_total"),
    ("vllm:prefix_cache_queries", "Prefix-cache queries, in queried tokens.", "prefix_cache_queries_total"),
    ("vllm:prefix_cache_hits", "Prefix-cache hits, in cached tokens.", "prefix_cache_hits_total"),
    ("playground:prefix_cache_evictions", "Cached blocks evicted to make room.", "evictions_total"),
    ("playground:cow_copies", "Copy-on-write copies of shared partial blocks.", "cow_copies_total"),
]

# (metric name, help, key of the heartbeat's "latency" histograms: playground/serving/worker/stats.py).
HISTOGRAMS = [
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds (per token, as "
     "vLLM before its inter_token_latency rename).", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of each request's mean time per output token.",
     "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent waiting before first scheduled, in seconds.",
     "queue"),
    ("vllm:request_prefill_time_seconds", "Histogram of time from first scheduled to first token, in seconds.",
     "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time from first to last token, in seconds.", "decode"),
]


def _bound(value: float) -> str:
    return repr(float(value))


def histogram_buckets(exported: dict[str, Any]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, ending with +Inf, from LatencyStats' per-bucket export."""
    buckets, running = [], 0
    for bound, count in zip(exported["bounds"], exported["counts"]):
        running += count
        buckets.append((_bound(bound), running))
    buckets.append(("+Inf", exported["count"]))
    return buckets


class WorkerCollector(Collector):
    """Renders the heartbeats `heartbeats()` returns (each {"name", "model", "metrics", "latency", "finished"})
    and the queue backlog `backlog()` returns ({queue: waiting tasks})."""

    def __init__(self, heartbeats, backlog) -> None:
        self.heartbeats = heartbeats
        self.backlog = backlog

    def collect(self) -> Iterator[Metric]:
        workers = [w for w in self.heartbeats() if w.get("metrics")]  # a loading worker has no figures yet
        yield from self._families(GaugeMetricFamily, GAUGES, workers)
        yield from self._families(CounterMetricFamily, COUNTERS, workers)
        for name, help_text, key in HISTOGRAMS:
            family = HistogramMetricFamily(name, help_text, labels=LABELS)
            for worker in workers:
                exported = (worker.get("latency") or {}).get(key)
                if exported is not None:
                    family.add_metric(_labels(worker), histogram_buckets(exported), sum_value=exported["sum"])
            yield family
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*LABELS, "finished_reason"])
        for worker in workers:
            for reason, count in sorted((worker.get("finished") or {}).items()):
                success.add_metric([*_labels(worker), reason], float(count))
        yield success
        backlog = GaugeMetricFamily("playground:queue_backlog", "Tasks waiting in each Celery queue (the shared "
                                    "one and each worker's own): the autoscaling signal.", labels=["queue"])
        for queue, waiting in sorted(self.backlog().items()):
            backlog.add_metric([queue], float(waiting))
        yield backlog

    @staticmethod
    def _families(kind, specs: Iterable[tuple[str, str, str]], workers: list[dict[str, Any]]) -> Iterator[Metric]:
        for name, help_text, key in specs:
            family = kind(name, help_text, labels=LABELS)
            for worker in workers:
                value = worker["metrics"].get(key)
                if value is not None:
                    family.add_metric(_labels(worker), float(value))
            yield family


def _labels(worker: dict[str, Any]) -> list[str]:
    return [worker["name"], worker.get("model") or ""]


def registry_for(heartbeats, backlog) -> CollectorRegistry:
    """A registry holding only the workers' figures and the queues' backlog (not this web process' own Python
    metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(heartbeats, backlog))
    return registry
