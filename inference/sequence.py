"""Plain state for one request and its sequences.

A `Request` is what a user submitted; it owns one `Sequence` per output sample. With `n > 1` the request
starts as a single sequence that prefills the prompt once; when the prompt is done it forks into `n`
sequences whose block tables share the prompt's blocks (see `BlockManager.fork`).
"""

from __future__ import annotations

import enum
import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from inference.lora import LoRAAdapter
from inference.sampling_params import SamplingParams


PROMPT_PENDING, PROMPT_CACHED, PROMPT_COMPUTED, PROMPT_RECOMPUTED = range(4)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_seq_ids = itertools.count()


@dataclass
class Sequence:
    """One token stream. Its KV lives in the blocks named by `block_table`.

    `num_computed_tokens` counts the leading tokens whose K/V are in the cache; the rest of `token_ids`
    still has to go through the model (a prompt not yet prefilled, or the last sampled token).
    """

    request: Request
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # The most tokens ever computed: computing below it again is recomputation after a preemption.
    num_computed_high_water: int = 0
    # Hashes of this sequence's full blocks, in order (prefix caching); grows as blocks fill.
    block_hashes: list[int] = field(default_factory=list)
    # How many leading blocks of block_table are registered in the prefix cache.
    num_cached_blocks: int = 0
    generator: torch.Generator | None = None
    output_text: str = ""
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # Incremental detokenisation state (see Detokenizer): a tokenizers DecodeStream, and the tokens it has read.
    decode_stream: object | None = None
    read_offset: int = 0
    # Characters of output_text and output tokens already handed to streaming clients.
    num_emitted_chars: int = 0
    num_emitted_tokens: int = 0
    # The grammar state after this sequence's output, when its request is constrained (an xgrammar
    # GrammarMatcher; see inference.structured_outputs).
    matcher: object | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def seats(self) -> int:
        """Batch seats (of `max_num_seqs`) this sequence holds: 1 once its request has forked, else its
        request's `n`, the samples (or beams) it becomes at the first sample. The one seat rule: the
        scheduler's admission and the contiguous counterfactual both count with it."""
        return 1 if self.request.forked else self.request.params.n

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class Logprob:
    """One token's log-probability at one position, in vLLM's shape: `rank` is how many tokens of the vocabulary
    are at least as likely, itself included (1 = the most likely; vLLM's count), `decoded_token` its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestMetrics:
    """Wall-clock times (time.perf_counter) of one request's life, for TTFT / ITL figures."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_computed_prompt_tokens: int = 0
    # Constrained requests: per output index, per generated token, how many vocabulary tokens the grammar
    # mask removed from the candidates (see inference.structured_outputs).
    masked_tokens: dict[int, list[int]] = field(default_factory=dict)
    mask_vocab_size: int | None = None  # the vocabulary those counts are out of
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    # Where each prompt token's K/V came from (PROMPT_* codes below); see inference/receipt.py.
    prompt_sources: bytearray = field(default_factory=bytearray)

    def record_cache_hit(self, num_prompt_tokens: int, hit_tokens: int) -> None:
        """At admission: the first `hit_tokens` prompt tokens come from the prefix cache (first time only)."""
        if not self.prompt_sources:
            self.prompt_sources = bytearray([PROMPT_PENDING]) * num_prompt_tokens
        for t in range(min(hit_tokens, num_prompt_tokens)):  # a readmitted sequence may hit past its prompt
            if self.prompt_sources[t] == PROMPT_PENDING:
                self.prompt_sources[t] = PROMPT_CACHED

    def record_scheduled(self, seq: Sequence, num_new_tokens: int, now: float) -> int:
        """A step scheduled at `now` computes `num_new_tokens` more of `seq`; returns how many are prompt tokens."""
        start = seq.num_computed_tokens
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now
        computed_prompt = max(0, min(seq.num_prompt_tokens, start + num_new_tokens) - start)
        self.num_computed_prompt_tokens += computed_prompt
        self.record_computed(seq, start, start + num_new_tokens)
        return computed_prompt

    def record_computed(self, seq: Sequence, start: int, end: int) -> None:
        """A step computed tokens [start, end) of `seq`: new, or recomputed below its high-water mark."""
        high = seq.num_computed_high_water
        self.num_recomputed_tokens += max(0, min(end, high) - start)
        seq.num_computed_high_water = max(high, end)
        if not self.prompt_sources:
            self.prompt_sources = bytearray([PROMPT_PENDING]) * seq.num_prompt_tokens
        for t in range(start, min(end, seq.num_prompt_tokens)):
            source = self.prompt_sources[t]
            if t < high or source in (PROMPT_CACHED, PROMPT_COMPUTED):
                self.prompt_sources[t] = PROMPT_RECOMPUTED
            elif source == PROMPT_PENDING:
                self.prompt_sources[t] = PROMPT_COMPUTED

    def record_token(self, now: float, timed: bool = True) -> None:
        """A token was generated at `now`; `timed`: it counts in `token_times` (one stream per request: the
        first sample's, or every beam step)."""
        if timed:
            self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None
    cache_salt: str | None = None
    # The LoRA adapter this request runs under (inference.lora.LoRAAdapter); None for the base model.
    adapter: LoRAAdapter | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    seqs: list[Sequence] = field(default_factory=list)
    # False until the prompt is prefilled and (for n > 1) the sequence forked into n samples.
    forked: bool = False
    # Set for beam-search requests (inference.beam_search.BeamState); None for sampling.
    beam: object | None = None
    # The compiled grammar the output must follow (a Future: it compiles in the background), or None.
    grammar: Future | None = None
    metrics: RequestMetrics = field(init=False)
    # With params.prompt_logprobs: one entry per prompt token computed so far, the first None (nothing
    # precedes it), each later one {token id: Logprob} for the prompt token and the top-k at its position.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.prompt_logprobs = None if self.params.prompt_logprobs is None else [None]
        self.seqs.append(self.new_sequence(0, list(self.prompt_token_ids)))

    def new_sequence(self, index: int, token_ids: list[int]) -> Sequence:
        seq = Sequence(self, index, token_ids, len(self.prompt_token_ids))
        if self.params.seed is not None:
            seq.generator = torch.Generator().manual_seed(self.params.seed + index)
        return seq

    @property
    def is_finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    @property
    def reads_prefix_cache(self) -> bool:
        """False for a request with prompt_logprobs (as vLLM skips the cache for it): every prompt position's
        logits must come out of its own prefill. Its blocks are still registered for others to reuse."""
        return self.params.prompt_logprobs is None

    @property
    def grammar_ready(self) -> bool:
        """False while the request's grammar is still compiling: the scheduler does not admit it yet."""
        return self.grammar is None or self.grammar.done()
