"""The contiguous-allocation counterfactual: what a pre-paging server would reserve for the same requests.

Before PagedAttention a server reserved one contiguous KV region per sequence, sized up front. Two sizes are
in use, and every view names which one it shows:
    "max_model_len"          every sequence reserves the model's whole context (the seeds' description)
    "prompt_plus_max_tokens" every sequence reserves its prompt plus its max_tokens (the best a contiguous
                             server can do when it trusts max_tokens)
Reservations are counted in whole blocks of the same pool, so they compare directly with paged usage.
"""

from __future__ import annotations

POLICIES = ("max_model_len", "prompt_plus_max_tokens")


def reserved_tokens(policy: str, prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """Token slots one sequence reserves under `policy` (never more than max_model_len)."""
    if policy == "max_model_len" or max_tokens is None:
        return max_model_len
    if policy == "prompt_plus_max_tokens":
        return min(prompt_len + max_tokens, max_model_len)
    raise ValueError(f"unknown contiguous policy {policy!r}; one of {POLICIES}")


def contiguous_admission(
    requests: list[tuple[int, int | None, int]], num_blocks: int, block_size: int, max_model_len: int
) -> dict[str, dict[str, int]]:
    """For requests in arrival order, each (prompt_len, max_tokens, sequences), per policy: the blocks all of
    them would reserve, and how many requests a pool of `num_blocks` admits first come first served (a request
    needs room for all its sequences at once)."""
    figures = {}
    for policy in POLICIES:
        total = admitted = 0
        room, queue_blocked = num_blocks, False
        for prompt_len, max_tokens, num_seqs in requests:
            blocks = num_seqs * -(-reserved_tokens(policy, prompt_len, max_tokens, max_model_len) // block_size)
            total += blocks
            queue_blocked = queue_blocked or blocks > room  # first come first served: no overtaking
            if not queue_blocked:
                room -= blocks
                admitted += 1
        figures[policy] = {"reserved_blocks": total, "admitted": admitted, "requests": len(requests)}
    return figures
