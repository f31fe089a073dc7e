"""What the engine hands back: vLLM-shaped request outputs and streaming deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.sequence import Logprob, Request, RequestMetrics

__all__ = ["CompletionOutput", "Logprob", "RequestOutput", "StreamDelta"]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
    # One {token id: logprob} dict per generated token, when SamplingParams.logprobs is set.
    logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs: per prompt token, None for the first, else {token id: Logprob}
    # holding the prompt token and the top-k at its position (vLLM's shape); filled as the prefill goes.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @classmethod
    def from_request(cls, request: Request) -> RequestOutput:
        if request.beam is not None:
            return cls._from_beam_search(request)
        want_logprobs = request.params.logprobs is not None
        outputs = [
            CompletionOutput(
                index=seq.index,
                text=seq.output_text,
                token_ids=list(seq.output_token_ids),
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                cumulative_logprob=seq.cumulative_logprob if want_logprobs else None,
                logprobs=list(seq.logprobs) if want_logprobs else None,
            )
            for seq in sorted(request.seqs, key=lambda s: s.index)
        ]
        return cls(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=outputs,
            finished=request.is_finished,
            metrics=request.metrics,
            num_cached_tokens=request.metrics.num_cached_tokens,
            prompt_logprobs=None if request.prompt_logprobs is None else list(request.prompt_logprobs),
        )

    @classmethod
    def _from_beam_search(cls, request: Request) -> RequestOutput:
        """Outputs are the finished hypotheses, best first; empty until the search ends."""
        outputs = [
            CompletionOutput(index=i, text=h.text, token_ids=list(h.token_ids), finish_reason=h.finish_reason,
                             cumulative_logprob=h.score)
            for i, h in enumerate(request.beam.finished if request.beam.done else [])
        ]
        return cls(request.request_id, request.prompt, list(request.prompt_token_ids), outputs,
                   request.is_finished, request.metrics, request.metrics.num_cached_tokens)

@dataclass
class StreamDelta:
    """New text and tokens of one output of one request since the previous delta."""

    request_id: str
    index: int
    text: str
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
