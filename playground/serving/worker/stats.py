"""Figures a worker derives from its engine over time: recent tokens/s and request latencies.

Plain Python (no Django, no torch), fed by the worker's snapshot publisher: `ThroughputMeter` turns the
engine's cumulative generation-token counter into a recent rate; `LatencyStats` takes each finished request's
`RequestMetrics` and keeps recent samples (for the dashboard's percentiles) and cumulative histograms (for
Prometheus, with vLLM's bucket bounds so vLLM dashboards' quantile panels read them the same way).
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)

RECENT_REQUESTS = 256  # TTFT and e2e percentiles are over this many latest requests
RECENT_TOKENS = 4096  # inter-token latency percentiles over this many latest gaps
PERCENTILES = (50, 90, 99)


class RequestTimes(Protocol):
    """What LatencyStats reads of `inference`'s RequestMetrics (perf_counter seconds)."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    token_times: list[float]


class ThroughputMeter:
    """Tokens per second over the last `window_s` seconds, from samples of a cumulative token counter."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, now: float, tokens_total: int) -> float:
        """Record the counter at time `now` (monotonic seconds); return the recent rate."""
        if self._samples and tokens_total < self._samples[-1][1]:
            self._samples.clear()  # the counter restarted (a new engine)
        self._samples.append((now, tokens_total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class Histogram:
    """A cumulative histogram with fixed upper bounds, exported as plain data for the worker heartbeat."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is (max bound, +Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.sum += value

    def export(self) -> dict[str, Any]:
        """`{"bounds", "counts", "sum", "count"}`; counts per bucket, the last one above every bound."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum, "count": sum(self.counts)}


def percentiles(values: list[float], scale: float = 1.0) -> dict[str, float | None]:
    """p50/p90/p99 (nearest rank) of `values` times `scale`; None for each when there are no values."""
    ordered = sorted(values)
    result: dict[str, float | None] = {}
    for p in PERCENTILES:
        if not ordered:
            result[f"p{p}"] = None
            continue
        rank = max(1, -(-p * len(ordered) // 100))  # ceil(p% of n), at least the first
        result[f"p{p}"] = round(ordered[rank - 1] * scale, 3)
    return result


class LatencyStats:
    """Latencies of finished requests: time to first token, inter-token gaps, time per output token, e2e.

    Thread-safe: request threads call `observe`, the publisher and the heartbeat read.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ttft: deque[float] = deque(maxlen=RECENT_REQUESTS)
        self._itl: deque[float] = deque(maxlen=RECENT_TOKENS)
        self.histograms = {
            "ttft": Histogram(TTFT_BUCKETS),
            "itl": Histogram(ITL_BUCKETS),
            "tpot": Histogram(ITL_BUCKETS),
            "e2e": Histogram(E2E_BUCKETS),
            # vLLM's phases of a request, with its request-latency bounds: arrival -> first scheduled (queue),
            # -> first token (prefill), -> last token (decode).
            "queue": Histogram(E2E_BUCKETS),
            "prefill": Histogram(E2E_BUCKETS),
            "decode": Histogram(E2E_BUCKETS),
        }
        self.finished = 0
        self._finish_reasons: dict[str, int] = {}

    def observe(self, times: RequestTimes) -> None:
        """Record one finished request. Token times are those of its first sample (the engine keeps one
        list per request), so inter-token gaps are a single stream's, as a user sees them."""
        gaps = [b - a for a, b in zip(times.token_times, times.token_times[1:])]
        with self._lock:
            self.finished += 1
            if times.first_token_time is not None:
                ttft = times.first_token_time - times.arrival_time
                self._ttft.append(ttft)
                self.histograms["ttft"].observe(ttft)
            for gap in gaps:
                self._itl.append(gap)
                self.histograms["itl"].observe(gap)
            if gaps:
                self.histograms["tpot"].observe(sum(gaps) / len(gaps))
            if times.finished_time is not None:
                self.histograms["e2e"].observe(times.finished_time - times.arrival_time)
            phases = (("queue", times.arrival_time, times.first_scheduled_time),
                      ("prefill", times.first_scheduled_time, times.first_token_time),
                      ("decode", times.first_token_time, times.last_token_time))
            for name, start, end in phases:
                if start is not None and end is not None:
                    self.histograms[name].observe(end - start)

    def count_finished(self, reasons: list[str]) -> None:
        """Count the finish reasons (stop, length, abort) of a request's outputs that ended with a reply."""
        with self._lock:
            for reason in reasons:
                self._finish_reasons[reason] = self._finish_reasons.get(reason, 0) + 1

    def finish_reasons(self) -> dict[str, int]:
        """Cumulative outputs by finish reason, for vllm:request_success_total via the heartbeat."""
        with self._lock:
            return dict(self._finish_reasons)

    def summary(self) -> dict[str, Any]:
        """Recent percentiles in milliseconds, for the dashboard: `{"ttft_ms", "itl_ms", "requests"}`."""
        with self._lock:
            return {
                "ttft_ms": percentiles(list(self._ttft), 1000),
                "itl_ms": percentiles(list(self._itl), 1000),
                "requests": self.finished,
            }

    def export(self) -> dict[str, dict[str, Any]]:
        """The cumulative histograms by name (ttft, itl, tpot, e2e, queue, prefill, decode), for Prometheus
        via the heartbeat."""
        with self._lock:
            return {name: histogram.export() for name, histogram in self.histograms.items()}
