"""Beam search as HF transformers does it (`generate(num_beams=W, do_sample=False)`), on shared blocks.

Each live beam is a `Sequence`. Every step, all live beams' next-token log-probabilities are added to
their running scores; the best 2W continuations are kept; the best W that did not just finish become
the next beams, and finished ones (EOS, or the length limit) enter the list of W hypotheses, scored by
`sum_logprobs / generated_length ** length_penalty`. A beam chosen more than once is forked: the copies
share every block by reference (copy-on-write splits the partial last block when each writes), and a
beam chosen by no continuation is freed at once. The stopping rule, including `early_stopping` True /
False / "never", follows HF's `_beam_search` so that results match it token for token.

    llm.beam_search(["The capital of France is"], BeamSearchParams(beam_width=4, max_tokens=16))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from inference.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.sequence import Sequence

NEG_INF = -1.0e9


@dataclass
class BeamSearchParams:
    """Beam search settings; names follow vLLM (`beam_width`, `max_tokens`) and HF (`early_stopping`)."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    ignore_eos: bool = False
    # Refused when set: a grammar mask would need a matcher per beam, forked at every step.
    structured_outputs: object | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"BeamSearchParams.beam_width must be an integer >= 1, got {self.beam_width!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"BeamSearchParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.structured_outputs is not None:
            raise ValueError("BeamSearchParams.structured_outputs: beam search does not support structured "
                             "outputs; sample instead (SamplingParams(n=..., structured_outputs=...))")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"BeamSearchParams.early_stopping must be True, False or 'never', "
                             f"got {self.early_stopping!r}")

    def sampling_params(self) -> SamplingParams:
        """The request-level settings the scheduler sees: W seats, greedy, the token limit."""
        return SamplingParams(n=self.beam_width, temperature=0, max_tokens=self.max_tokens,
                              ignore_eos=self.ignore_eos)


@dataclass
class Hypothesis:
    token_ids: list[int]
    score: float
    finish_reason: str
    text: str = ""


@dataclass
class BeamState:
    params: BeamSearchParams
    max_tokens: int
    # Running score (sum of log-probs) of each live beam, by seq_id.
    scores: dict[int, float] = field(default_factory=dict)
    # Logits of live beams already computed this round, waiting for the rest (after a preemption).
    pending: dict[int, torch.Tensor] = field(default_factory=dict)
    finished: list[Hypothesis] = field(default_factory=list)
    improvement_possible: bool = True
    done: bool = False


@dataclass
class Continuation:
    parent_index: int
    token: int
    score: float


def advance(
    state: BeamState, output_ids: list[list[int]], scores: torch.Tensor, logits: torch.Tensor, eos: int | None
) -> list[Continuation]:
    """One beam step over the live beams' logits; returns the next beams and updates `state`.

    `output_ids[b]` are beam b's generated tokens so far (all beams have the same count), `scores[b]` its
    running score. Sets `state.done` when HF would stop.
    """
    width, params = state.params.beam_width, state.params
    vocab = logits.shape[1]
    generated = len(output_ids[0]) + 1
    totals = (logits.log_softmax(-1) + scores[:, None]).flatten()
    top_scores, top_index = totals.topk(min(2 * width, totals.numel()))
    parents = (top_index // vocab).tolist()
    tokens = (top_index % vocab).tolist()
    top = top_scores.tolist()
    hits = [(eos is not None and t == eos) or generated >= state.max_tokens for t in tokens]

    running = sorted(range(len(top)), key=lambda c: top[c] + (NEG_INF if hits[c] else 0.0), reverse=True)[:width]
    next_beams = [Continuation(parents[c], tokens[c], top[c] + (NEG_INF if hits[c] else 0.0)) for c in running]

    full = len(state.finished) == width and params.early_stopping is True
    if state.improvement_possible and not full:
        fresh = [
            Hypothesis(output_ids[parents[c]] + [tokens[c]], top[c] / generated**params.length_penalty,
                       "stop" if eos is not None and tokens[c] == eos else "length")
            for c in range(min(width, len(top))) if hits[c]
        ]
        merged = state.finished + fresh
        state.finished = sorted(merged, key=lambda h: h.score, reverse=True)[:width]

    best_length = state.max_tokens if params.early_stopping == "never" and params.length_penalty > 0 else generated
    best_possible = next_beams[0].score / best_length**params.length_penalty
    if len(state.finished) == width:
        state.improvement_possible &= best_possible > min(h.score for h in state.finished)
    all_finished = len(state.finished) == width and params.early_stopping is True
    state.done = not state.improvement_possible or all_finished or all(hits)
    return next_beams


def beam_step(
    seq: Sequence,
    logits: torch.Tensor,
    fork: Callable[[Sequence, Sequence], None],
    finish: Callable[[Sequence, str], None],
    decode: Callable[[list[int]], str],
) -> int:
    """Collect one beam's logits; once every live beam of its request has its own, advance the search.

    Returns how many beams took a token (0 while a preempted beam is still catching up). Children copy the
    parent's tokens as they are before any beam appends its own; every parent chosen more than once is
    `fork`ed (blocks shared by reference), one chosen by nothing is `finish`ed ("abort": its blocks go back
    at once). When the search is done every hypothesis is decoded and every live beam finished ("stop").
    """
    request, state = seq.request, seq.request.beam
    state.pending[seq.seq_id] = logits
    live = [s for s in request.seqs if not s.is_finished]
    if len(state.pending) < len(live):
        return 0
    request.forked = True
    scores = torch.tensor([state.scores[s.seq_id] for s in live], device=logits.device)
    stacked = torch.stack([state.pending.pop(s.seq_id) for s in live])
    continuations = advance(state, [s.output_token_ids for s in live], scores, stacked, request.eos_token_id)
    if state.done:
        for hypothesis in state.finished:
            hypothesis.text = decode(hypothesis.token_ids)
        for beam in live:
            finish(beam, "stop")
        return len(live)
    picks: dict[int, list[Continuation]] = {}
    for c in continuations:
        picks.setdefault(c.parent_index, []).append(c)
    next_live: list[Sequence] = []
    for index, parent in enumerate(live):
        chosen = picks.get(index, [])
        if not chosen:
            finish(parent, "abort")
            continue
        for c in chosen[1:]:
            child = request.new_sequence(parent.index, list(parent.token_ids))
            fork(parent, child)
            child.token_ids.append(c.token)
            state.scores[child.seq_id] = c.score
            next_live.append(child)
        parent.token_ids.append(chosen[0].token)
        state.scores[parent.seq_id] = chosen[0].score
        next_live.append(parent)
    for beam in live:
        if beam.is_finished:
            del state.scores[beam.seq_id]
    request.seqs = next_live
    return len(live)
