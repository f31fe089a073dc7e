"""The PagedAttention lab: a sandbox engine with a tiny KV pool that a presenter steps one step at a time.

A `LabSession` is a real `LLMEngine` (real scheduler, block manager and model) whose pool is a few dozen
blocks, so that every allocation, prefix hit, copy-on-write, preemption and eviction is visible. It can share
the weights of an engine already loaded (a worker's), never its KV pool. Requests are named A, B, C... and
those names are their request ids, so the event log's plain-language sentences read as the page shows them.

After every `step()` the session hands back a `snapshot()`: the physical pool (the engine's `PoolView`, with
each block's fill),
each request's logical blocks with their physical block ids, the free queue in eviction order, the step's
events with a sentence each, and the contiguous-allocation counterfactual (LLMEngine.contiguous_counterfactual).
Single-threaded like the engine: one caller at a time. Beside a live engine, step it on that engine's loop
thread with StreamingEngine.call_in_background, which keeps it to the gaps the live batch leaves.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, replace

from inference.beam_search import BeamSearchParams
from inference.config import DTYPES, EngineArgs
from inference.engine import LLMEngine
from inference.sampling_params import SamplingParams
from inference.sequence import Request, SequenceStatus

# What a presenter may choose on the page (the page is served these ranges; nothing else checks them).
LAB_LIMITS = {
    "num_blocks": (8, 64),
    "block_size": (8, 16),
    "max_num_seqs": (1, 16),
    "max_num_batched_tokens": (16, 256),
    "max_model_len": (32, 256),
    "max_tokens": (1, 128),
    "n": (1, 8),
    "beam_width": (1, 8),
}
LAB_BLOCK_SIZES = (8, 16)
MAX_LAB_REQUESTS = 26  # one letter each
RECORDING_LIMIT = 200_000  # events; a lab of 26 short requests stays far below
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class LabConfig:
    num_blocks: int = 32
    block_size: int = 8
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    max_model_len: int = 128

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            low, high = LAB_LIMITS[name]
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"lab {name} must be an integer in [{low}, {high}], got {value!r}")
        if self.block_size not in LAB_BLOCK_SIZES:
            raise ValueError(f"lab block_size must be one of {LAB_BLOCK_SIZES}, got {self.block_size}")
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError(f"{self.num_blocks} blocks of {self.block_size} tokens cannot hold one sequence of "
                             f"max_model_len={self.max_model_len}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")


@dataclass(frozen=True)
class LabRequest:
    """What a presenter adds: a prompt and how to continue it (greedy unless a temperature is given)."""

    prompt: str
    max_tokens: int = 16
    n: int = 1
    temperature: float = 0.0
    seed: int = 0
    beam_width: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError("a lab request needs a non-empty prompt")
        for name in ("max_tokens", "n") + (("beam_width",) if self.beam_width is not None else ()):
            low, high = LAB_LIMITS[name]
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"lab {name} must be an integer in [{low}, {high}], got {value!r}")
        if self.beam_width is not None and self.n != 1:
            raise ValueError("a beam search request has beam_width samples; leave n at 1")


class LabSession:
    """One presenter's sandbox: its own pool and event log, optionally another engine's weights."""

    def __init__(self, config: LabConfig, shared: LLMEngine | None = None, model: str | None = None,
                 pool_bytes: int | None = None) -> None:
        """`shared`: an engine whose weights (and model, device, dtype, attention backend) the sandbox reuses; without it the
        sandbox loads `model` (default: the built-in one) itself, in float32 on the CPU. `pool_bytes`: size the
        pool in bytes instead of `config.num_blocks` blocks: the engine divides them by its block's bytes (so a
        model with a smaller cache per token gets more blocks), and `self.config` states the blocks it got."""
        if shared is not None:
            placement = {"model": shared.args.model, "device": str(shared.runner.device),
                         "dtype": DTYPE_NAMES[shared.runner.dtype], "attention_backend": shared.args.attention_backend}
        else:
            placement = {"device": "cpu", "dtype": "float32", **({"model": model} if model else {})}
        args = EngineArgs(
            **({"kv_cache_memory": pool_bytes} if pool_bytes else {"num_kv_blocks": config.num_blocks}),
            block_size=config.block_size, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
            enable_prefix_caching=True, event_log_capacity=10_000, **placement,
        )
        self.engine = LLMEngine(args, share_weights_with=shared)
        self.config = replace(config, num_blocks=self.engine.runner.num_blocks)  # checks a bytes-sized pool too
        self.engine.start_recording(limit=RECORDING_LIMIT)  # from the empty pool: the whole lab replays
        self.requests: dict[str, LabRequest] = {}
        self._engine_requests: dict[str, Request] = {}  # kept after the engine forgets finished ones
        self._reported_events = 0

    @property
    def step_number(self) -> int:
        return self.engine.events.step

    def add(self, request: LabRequest) -> str:
        """Queue a request; returns its letter. Validated before anything changes."""
        if len(self.requests) >= MAX_LAB_REQUESTS:
            raise ValueError(f"a lab holds at most {MAX_LAB_REQUESTS} requests; reset it to start again")
        label = string.ascii_uppercase[len(self.requests)]
        if request.beam_width is not None:
            beam = BeamSearchParams(beam_width=request.beam_width, max_tokens=request.max_tokens, ignore_eos=True)
            made = self.engine.make_beam_request(label, request.prompt, beam)
        else:
            params = SamplingParams(n=request.n, temperature=request.temperature, seed=request.seed,
                                    max_tokens=request.max_tokens, ignore_eos=True)
            made = self.engine.make_request(label, request.prompt, params)
        self.engine.add(made)
        self.requests[label] = request
        self._engine_requests[label] = made
        return label

    def abort(self, label: str) -> None:
        if self.engine.abort_request(label) is None:
            raise ValueError(f"request {label!r} is not running or waiting")

    def step(self) -> dict:
        """One engine step (an idle one only advances the step number); the snapshot after it."""
        self.engine.step()
        return self.snapshot()

    def is_idle(self) -> bool:
        return not self.engine.has_unfinished_requests()

    def new_events(self) -> list[dict]:
        """Events since the previous call, each with its plain-language sentence."""
        events = list(self.engine.events.events)
        total = len(events) + self.engine.events.num_dropped
        fresh = events[max(0, len(events) - (total - self._reported_events)):]
        self._reported_events = total
        return [{**e.to_dict(), "text": e.describe()} for e in fresh]

    def recording(self) -> dict:
        """Every event since the lab opened, with what a replay needs to draw it, as plain JSON."""
        return self.engine.events.recording.to_dict()

    def snapshot(self) -> dict:
        engine, bs = self.engine, self.engine.block_size
        view = engine.pool_view()
        filled: dict[int, int] = {}  # tokens written into each held block (the fullest holder's count)
        for seq in engine.live_sequences():
            for i, block_id in enumerate(seq.block_table):
                filled[block_id] = max(filled.get(block_id, 0), min(bs, seq.num_computed_tokens - i * bs))
        owners = view.block_owners()
        blocks = [
            {"id": b, "ref_count": view.ref_counts[b], "hash": view.hashes[b], "state": view.state(b),
             "filled": filled.get(b, 0), "owners": owners.get(b, [])}
            for b in range(view.num_blocks)
        ]
        metrics = engine.metrics(block_map=False)
        return {
            "step": self.step_number,
            "config": asdict(self.config),
            "blocks": blocks,
            "free_queue": engine.block_manager.free_queue(),
            "requests": self.snapshot_requests(),
            "events": self.new_events(),
            "counters": {k: metrics[k] for k in (
                "num_blocks_used", "num_blocks_free", "num_blocks_cached", "num_blocks_shared",
                "num_preemptions_total", "cow_copies_total", "evictions_total", "prefix_cache_hits_total",
                "prefix_cache_queries_total")},
            "contiguous": metrics["contiguous"],
            "idle": self.is_idle(),
        }

    def snapshot_requests(self) -> list[dict]:
        """Each request's status, logical blocks (block tables) and text so far, in arrival order."""
        return [self._request_view(label) for label in self.requests]

    def _request_view(self, label: str) -> dict:
        request, lab_request = self._engine_requests[label], self.requests[label]
        seqs = sorted(request.seqs, key=lambda s: s.index)
        status = ("finished" if request.is_finished else
                  "running" if any(s.status is SequenceStatus.RUNNING for s in seqs) else "waiting")
        return {
            "label": label,
            "status": status,
            "kind": "beam" if lab_request.beam_width else ("sample" if lab_request.n > 1 else "greedy"),
            "prompt_tokens": len(request.prompt_token_ids),
            "cached_tokens": request.metrics.num_cached_tokens,
            "seqs": [
                {"index": s.index, "block_table": list(s.block_table), "context_len": s.num_computed_tokens,
                 "output_tokens": s.num_output_tokens, "text": s.output_text, "status": s.status.value}
                for s in seqs
            ],
        }
