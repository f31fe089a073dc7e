"""A request's cache receipt: where its prompt's K/V came from and where its time went.

Per prompt token the engine records (RequestMetrics.record_cache_hit / record_computed) whether it was served
from the prefix cache, computed, or recomputed after a preemption. The receipt run-length encodes that into
spans, and adds the figures a user asks about a reply: cached tokens and blocks, recomputed tokens,
preemptions, queue / prefill / decode time, TTFT and time per output token. The chat page colours the prompt
by these spans; the API returns the same receipt in `usage`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from inference.sequence import PROMPT_CACHED, PROMPT_COMPUTED, PROMPT_RECOMPUTED, RequestMetrics

SOURCE_NAMES = {PROMPT_CACHED: "cached", PROMPT_COMPUTED: "computed", PROMPT_RECOMPUTED: "recomputed"}


@dataclass(frozen=True)
class CacheReceipt:
    cached_tokens: int
    cached_blocks: int
    recomputed_tokens: int
    preemptions: int
    queue_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    # [start, end, "cached" | "computed" | "recomputed"] over the prompt's token positions
    provenance: list[list]

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_spans(sources: bytearray) -> list[list]:
    """Run-length spans of the prompt's token sources (tokens never computed, e.g. of an aborted request,
    are left out)."""
    spans: list[list] = []
    for t, source in enumerate(sources):
        name = SOURCE_NAMES.get(source)
        if name is None:
            continue
        if spans and spans[-1][2] == name and spans[-1][1] == t:
            spans[-1][1] = t + 1
        else:
            spans.append([t, t + 1, name])
    return spans


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000, 2)


def cache_receipt(metrics: RequestMetrics, block_size: int, num_output_tokens: int) -> CacheReceipt:
    decode_ms = _ms(metrics.first_token_time, metrics.finished_time or metrics.last_token_time)
    tpot = None if decode_ms is None or num_output_tokens < 2 else round(decode_ms / (num_output_tokens - 1), 2)
    return CacheReceipt(
        cached_tokens=metrics.num_cached_tokens,
        cached_blocks=metrics.num_cached_tokens // block_size,
        recomputed_tokens=metrics.num_recomputed_tokens,
        preemptions=metrics.num_preemptions,
        queue_ms=_ms(metrics.arrival_time, metrics.first_scheduled_time),
        prefill_ms=_ms(metrics.first_scheduled_time, metrics.first_token_time),
        decode_ms=decode_ms,
        ttft_ms=_ms(metrics.arrival_time, metrics.first_token_time),
        tpot_ms=tpot,
        provenance=prompt_spans(metrics.prompt_sources),
    )
