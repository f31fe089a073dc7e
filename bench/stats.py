"""Per-engine figures from per-request token times: throughput, TTFT and inter-token latency percentiles.

Every engine adapter reduces its run to `RequestTiming`s (absolute `time.perf_counter()` values), so every
engine's figures are computed by the same code from the same kind of measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestTiming:
    """When one output sequence's request arrived and when each of its tokens appeared (perf_counter seconds).

    A request with n > 1 samples gives one timing per sample, so inter-token gaps stay within one sequence.
    """

    request_id: str
    arrival: float
    num_prompt_tokens: int
    token_times: list[float]

    @property
    def ttft(self) -> float:
        return min(self.token_times) - self.arrival

    @property
    def finish(self) -> float:
        return max(self.token_times)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy; NaN for an empty list."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def inter_token_gaps(timing: RequestTiming) -> list[float]:
    times = sorted(timing.token_times)
    return [b - a for a, b in zip(times, times[1:])]


@dataclass
class LatencyFigures:
    output_tokens: int
    num_requests: int
    elapsed_s: float
    ttft_s: dict[str, float] = field(default_factory=dict)
    itl_s: dict[str, float] = field(default_factory=dict)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "output_tokens": self.output_tokens,
            "num_requests": self.num_requests,
            "elapsed_s": self.elapsed_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
        }
        for q in PERCENTILES:
            out[f"ttft_p{q}_s"] = self.ttft_s[f"p{q}"]
            out[f"itl_p{q}_s"] = self.itl_s[f"p{q}"]
        return out


def latency_figures(timings: list[RequestTiming], start: float) -> LatencyFigures:
    """Throughput over the whole run (from `start` to the last token) and latency percentiles over requests."""
    if not timings:
        raise ValueError("no request timings: the engine produced no output")
    empty = [t.request_id for t in timings if not t.token_times]
    if empty:
        raise ValueError(f"requests without any output token: {empty[:5]}")
    elapsed = max(t.finish for t in timings) - start
    ttfts = [t.ttft for t in timings]
    gaps = [g for t in timings for g in inter_token_gaps(t)]
    return LatencyFigures(
        output_tokens=sum(len(t.token_times) for t in timings),
        num_requests=len(timings),
        elapsed_s=elapsed,
        ttft_s={f"p{q}": percentile(ttfts, q) for q in PERCENTILES},
        itl_s={f"p{q}": percentile(gaps, q) for q in PERCENTILES},
    )
