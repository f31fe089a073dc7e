"""KV-cache accounting: memory reserved vs memory holding live tokens, over time, for every engine.

Our engine reports its block usage through `metrics()`, sampled every step. The peers do not, so their
reservation is reconstructed from what they demonstrably do and the token times we measured: a static padded
batch holds `batch x (longest prompt + tokens so far)` slots until the whole batch returns; a paged peer holds
`ceil(context / page_size)` pages per running sequence; a fixed pre-allocation holds its whole size. A
sequence's tokens are *live* from its admission until its last token; after that (a finished row still sitting
in a padded batch) they are waste. So the contiguous waste is measured from the run, not assumed.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one token's K and V across all layers."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 4

    @classmethod
    def from_hf_config(cls, config: Any, dtype: str = "float32") -> KVGeometry:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_key_value_heads, head_dim, _DTYPE_BYTES[dtype])

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass
class KVSample:
    """From `time` until the next sample, `reserved` token slots were held and `live` of them held live tokens."""

    time: float
    reserved: int
    live: int


@dataclass
class KVTimeline:
    samples: list[KVSample]  # sorted by time; the last one holds until `end`
    end: float

    def _durations(self) -> list[float]:
        times = [s.time for s in self.samples] + [self.end]
        return [max(b - a, 0.0) for a, b in zip(times, times[1:])]

    def summary(self, geometry: KVGeometry, block_size: int) -> dict[str, float]:
        """Peak and time-averaged reservation, and utilisation = live slot-seconds / reserved slot-seconds."""
        if not self.samples:
            raise ValueError("empty KV timeline: nothing was sampled during the run")
        durations = self._durations()
        total = sum(durations) or 1.0
        reserved_area = sum(s.reserved * d for s, d in zip(self.samples, durations))
        live_area = sum(s.live * d for s, d in zip(self.samples, durations))
        peak = max(s.reserved for s in self.samples)
        return {
            "kv_peak_reserved_tokens": peak,
            "kv_peak_blocks": math.ceil(peak / block_size),
            "kv_peak_reserved_bytes": peak * geometry.bytes_per_token,
            "kv_avg_reserved_bytes": reserved_area / total * geometry.bytes_per_token,
            "kv_avg_live_bytes": live_area / total * geometry.bytes_per_token,
            "kv_slot_utilization_avg": live_area / reserved_area if reserved_area else math.nan,
        }

    def relative_to(self, start: float) -> list[tuple[float, int, int]]:
        """(seconds since start, reserved, live) points, for plots."""
        return [(s.time - start, s.reserved, s.live) for s in self.samples]


@dataclass
class SequenceSpan:
    """One sequence's tenure in a cache: admitted at `start`, one token at each of `token_times` (sorted)."""

    start: float
    num_prompt_tokens: int
    token_times: list[float]

    @property
    def last(self) -> float:
        return self.token_times[-1] if self.token_times else self.start

    def context_at(self, t: float) -> int:
        """Tokens this sequence holds at time t (0 before admission and after its last token)."""
        if t < self.start or t >= self.last:
            return 0
        return self.num_prompt_tokens + bisect.bisect_right(self.token_times, t)


def paged_timeline(spans: list[SequenceSpan], page_size: int) -> KVTimeline:
    """A paged cache: each running sequence holds ceil(context / page_size) pages (sharing not credited)."""
    times = sorted({s.start for s in spans} | {t for s in spans for t in s.token_times})
    samples = []
    for t in times:
        contexts = [c for c in (s.context_at(t) for s in spans) if c]
        reserved = sum(math.ceil(c / page_size) * page_size for c in contexts)
        samples.append(KVSample(t, reserved, sum(contexts)))
    return KVTimeline(samples, end=max(s.last for s in spans))


def fixed_pool_timeline(spans: list[SequenceSpan], pool_tokens: int) -> KVTimeline:
    """A cache pre-allocated once (llama.cpp's n_ctx): the whole pool is reserved from the first admission."""
    times = sorted({s.start for s in spans} | {t for s in spans for t in s.token_times})
    samples = [KVSample(t, pool_tokens, sum(s.context_at(t) for s in spans)) for t in times]
    return KVTimeline(samples, end=max(s.last for s in spans))


@dataclass
class StaticBatch:
    """One `generate` call of a static padded batch; token k of every row appeared at `step_times[k]`."""

    start: float
    end: float
    step_times: list[float]
    prompt_lens: list[int]
    output_lens: list[int]  # tokens each row actually asked for (the batch runs to the longest)


def contiguous_timeline(batches: list[StaticBatch], reserve_len: int | None = None) -> KVTimeline:
    """Static padded batches with a contiguous cache.

    With `reserve_len` None the reservation is what a padded dynamic cache holds: every row is as long as the
    longest prompt plus the tokens generated so far. With `reserve_len` set, every row pre-allocates that many
    slots (max-length pre-allocation, the seeds' baseline). A row is live until its own last wanted token.
    """
    samples = []
    for batch in batches:
        rows, padded = len(batch.prompt_lens), max(batch.prompt_lens)
        for k, t in enumerate([batch.start] + batch.step_times):  # k tokens in the cache after time t
            reserved = rows * (reserve_len if reserve_len is not None else padded + k)
            live = sum(p + k for p, n in zip(batch.prompt_lens, batch.output_lens) if k < n)
            samples.append(KVSample(t, reserved, live))
        samples.append(KVSample(batch.end, 0, 0))  # the cache is dropped when generate returns
    samples.sort(key=lambda s: s.time)
    return KVTimeline(samples, end=batches[-1].end)


def capacity(budget_tokens: int, seq_lens: list[int], padded_row_len: int, max_model_len: int,
             block_size: int) -> dict[str, float]:
    """How many sequences of this workload fit at once in `budget_tokens` slots under each allocation policy.

    max-length pre-allocation reserves `max_model_len` per sequence; padded-to-longest reserves the workload's
    longest padded row (longest prompt + longest output) for every row; paging reserves ceil(len /
    block_size) blocks for the average sequence.
    """
    if not seq_lens:
        raise ValueError("capacity needs at least one sequence length")
    mean_paged = sum(math.ceil(n / block_size) * block_size for n in seq_lens) / len(seq_lens)
    return {
        "max_length_prealloc": budget_tokens // max_model_len,
        "padded_to_longest": budget_tokens // padded_row_len,
        "paging": budget_tokens / mean_paged,
    }
