"""Turn one logits row per sequence into one token per sequence, vectorised over the batch.

Order of operations (as in vLLM): penalties on the raw logits, then temperature, then top-k, top-p and
min-p filtering, then sampling. Greedy rows take the argmax of the penalised logits. Random rows draw
with the exponential-race trick (argmax of probs / Exp(1) noise), which lets each seeded sequence use
its own `torch.Generator` for its noise row, so its tokens do not depend on what else is in the batch.
Log-probabilities, when asked for, come from the raw logits, before any of the processing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.sequence import Sequence


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row: {token id: logprob} with the top-k and the sampled token, or None when not asked for.
    logprobs: list[dict[int, float] | None]
    sampled_logprobs: list[float]


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition penalty over prompt + output tokens (HF/vLLM rule); presence/frequency over output only."""
    rows = [i for i, s in enumerate(seqs) if s.request.params.repetition_penalty != 1.0]
    if rows:
        for i in rows:
            ids = torch.tensor(seqs[i].token_ids, device=logits.device).unique()
            penalty = seqs[i].request.params.repetition_penalty
            picked = logits[i, ids]
            logits[i, ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    rows = [
        i for i, s in enumerate(seqs)
        if s.request.params.presence_penalty != 0 or s.request.params.frequency_penalty != 0
    ]
    if rows:
        counts = torch.zeros(len(rows), logits.shape[1], device=logits.device)
        for r, i in enumerate(rows):
            out = seqs[i].output_token_ids
            if out:
                ids = torch.tensor(out, device=logits.device)
                counts[r].scatter_add_(0, ids, torch.ones(len(out), device=logits.device))
        presence = _column([seqs[i].request.params.presence_penalty for i in rows], logits.device)
        frequency = _column([seqs[i].request.params.frequency_penalty for i in rows], logits.device)
        index = torch.tensor(rows, device=logits.device)
        logits[index] -= frequency * counts + presence * (counts > 0).float()
    return logits


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Apply top-k, top-p and min-p to temperature-scaled logits by masking with -inf."""
    params = [s.request.params for s in seqs]
    vocab = logits.shape[1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
    top_p = _column([p.top_p for p in params], logits.device)
    if (top_k < vocab).any() or (top_p < 1).any():
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        drop = ranks >= top_k.unsqueeze(1)
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop |= (probs.cumsum(-1) - probs) >= top_p
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    min_p = _column([p.min_p for p in params], logits.device)
    if (min_p > 0).any():
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    return logits


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
    """One token per row of `logits` [num_seqs, vocab] (float32), following each sequence's params."""
    params = [s.request.params for s in seqs]
    raw_logprobs = None
    if any(p.logprobs is not None for p in params):
        raw_logprobs = logits.log_softmax(-1)
    logits = _apply_penalties(logits.clone(), seqs)
    token_ids = logits.argmax(-1)

    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if random_rows:
        index = torch.tensor(random_rows, device=logits.device)
        scaled = logits[index] / _column([params[i].temperature for i in random_rows], logits.device)
        probs = _filter(scaled, [seqs[i] for i in random_rows]).softmax(-1)
        noise = torch.empty_like(probs).exponential_()
        for r, i in enumerate(random_rows):
            if seqs[i].generator is not None:
                noise[r] = torch.empty(probs.shape[1]).exponential_(generator=seqs[i].generator).to(probs.device)
        token_ids[index] = (probs / noise).argmax(-1)

    ids = token_ids.tolist()
    logprob_dicts: list[dict[int, float] | None] = [None] * len(seqs)
    sampled: list[float] = [0.0] * len(seqs)
    if raw_logprobs is not None:
        chosen = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
        k = max(p.logprobs or 0 for p in params)
        top_values, top_ids = raw_logprobs.topk(k, dim=-1) if k else (None, None)
        for i, p in enumerate(params):
            sampled[i] = chosen[i]
            if p.logprobs is None:
                continue
            entry = {ids[i]: chosen[i]}
            if p.logprobs:
                entry.update(zip(top_ids[i, : p.logprobs].tolist(), top_values[i, : p.logprobs].tolist()))
            logprob_dicts[i] = entry
    return SamplerOutput(ids, logprob_dicts, sampled)
