"""LLMEngine: requests in, one scheduler + forward + sampler step at a time, outputs out.

Single-threaded by design: every method must be called from one thread (the `LLM` caller, or the
`StreamingEngine` loop thread). See DESIGN.md "Engine step" for what `step()` does. The engine only wires
its parts: `InputProcessor` makes requests, the `Scheduler` owns the queues and the block manager (the engine
never touches `running`, `waiting` or the pool), `beam_step` and `check_stop` decide beams and stops, and
the pool is read through one `PoolView`.
"""

from __future__ import annotations

import functools
import time

import torch

from inference.beam_search import BeamSearchParams, beam_step
from inference.block_manager import BlockManager, IntegrityError
from inference.config import EngineArgs
from inference.counterfactual import contiguous_admission
from inference.detokenizer import Detokenizer
from inference.events import EventLog, Finished, Recording, RequestAdded
from inference.generation_config import read_generation_config
from inference.input_processor import InputProcessor, load_tokenizer
from inference.lora import LoRARequest
from inference.model_loader import resolve_model
from inference.model_runner import ModelRunner
from inference.outputs import RequestOutput
from inference.pool_view import PoolView
from inference.sampler import sample, token_logprobs
from inference.sampling_params import SamplingParams
from inference.scheduler import Scheduler
from inference.sequence import Logprob, Request, Sequence, SequenceStatus
from inference.stopping import check_stop
from inference.structured_outputs import StructuredOutputManager

# Prompt-logprob rows turned into logprobs at a time: 256 rows of SmolLM2's vocabulary are 50 MB of float32.
PROMPT_LOGPROB_ROWS = 256


class LLMEngine:
    def __init__(self, args: EngineArgs, share_weights_with: LLMEngine | None = None) -> None:
        """`share_weights_with`: an engine whose loaded (maybe quantized) weights this one uses instead of
        loading its own (the lab's sandboxes share a worker's); this engine still gets its own KV pool,
        scheduler and block manager."""
        self.args = args
        folder = resolve_model(args.model)
        torch.manual_seed(args.seed)
        self.tokenizer = load_tokenizer(folder)
        self.generation = read_generation_config(folder, args.generation_config)
        self.runner = ModelRunner(args, folder, share_weights_with.runner if share_weights_with else None)
        try:
            self._start(args)
        except BaseException:
            self.close()  # a tensor-parallel runner's processes stop with the failed engine
            raise

    def _start(self, args: EngineArgs) -> None:
        """Everything but the weights and the KV pool: the block manager, the scheduler and their helpers."""
        self.block_size = args.block_size
        self.max_model_len = self._resolve_max_model_len(args)
        self.events = EventLog(args.event_log_capacity)
        self.block_manager = BlockManager(self.runner.num_blocks, args.block_size, args.enable_prefix_caching,
                                          self.events)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs, args.max_num_batched_tokens,
                                   self.runner.lora)
        self.detokenizer = Detokenizer(self.tokenizer)
        self._decode_hypothesis = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        self.structured = StructuredOutputManager(self.tokenizer, self.runner.cfg.vocab_size)
        self.processor = InputProcessor(self.tokenizer, self.runner.cfg.vocab_size, args, self.max_model_len,
                                        self.runner.lora, self.structured,
                                        self.generation.stop_token_ids(self.tokenizer.eos_token_id))
        self.requests: dict[str, Request] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def _resolve_max_model_len(self, args: EngineArgs) -> int:
        """The longest sequence (prompt + output) this engine serves: `args.max_model_len`, or when unset what
        both the model (`max_position_embeddings`) and the KV pool allow, as vLLM derives it from the model.
        A set value the pool cannot hold in one sequence is refused: such a request could never finish."""
        pool_tokens = self.runner.num_blocks * args.block_size
        if args.max_model_len is None:
            return min(self.runner.cfg.max_position_embeddings, pool_tokens)
        if pool_tokens < args.max_model_len:
            raise ValueError(
                f"the KV pool holds {self.runner.num_blocks} blocks x {args.block_size} tokens, less than one "
                f"sequence of max_model_len={args.max_model_len}; raise the KV budget or lower max_model_len"
            )
        return args.max_model_len

    # --- requests -------------------------------------------------------------------------------

    def make_request(self, request_id: str, prompt: str | dict, params: SamplingParams,
                     arrival_time: float | None = None, cache_salt: str | None = None,
                     lora_request: LoRARequest | None = None) -> Request:
        """Tokenise and validate a request without touching engine state (safe from any thread)."""
        return self.processor.make_request(request_id, prompt, params, arrival_time, cache_salt, lora_request)

    def add_request(self, request_id: str, prompt: str | dict, params: SamplingParams,
                    arrival_time: float | None = None, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        self.add(self.make_request(request_id, prompt, params, arrival_time, cache_salt, lora_request))

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        if self.events.enabled:
            self.events.emit(RequestAdded, request_id=request.request_id, seq_id=request.seqs[0].seq_id,
                             num_prompt_tokens=len(request.prompt_token_ids), n=request.params.n)
        for seq in request.seqs:
            self.detokenizer.start(seq)
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; returns its final output, or None if unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.seqs:
            if not seq.is_finished:
                self._finish(seq, "abort")
        request.metrics.finished_time = time.perf_counter()
        return RequestOutput.from_request(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def check_alive(self) -> None:
        """Raise `RankFailedError` if a tensor-parallel rank has died: the engine cannot step again."""
        self.runner.check_alive()

    def close(self) -> None:
        """Stop the tensor-parallel rank processes, if any (idempotent). The engine cannot step after it."""
        self.runner.close()

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch step; return outputs (cumulative) for every request that made progress."""
        self.events.step += 1
        failed = self._fail_uncompiled_grammars()
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            # Only requests whose grammar is compiling are left: sleep until one is ready, not spin.
            self.structured.wait_for_grammars(r.seqs[0] for r in self.scheduler.waiting_requests())
            return failed
        now = time.perf_counter()
        for item in plan.scheduled:
            self.prompt_tokens_total += item.seq.request.metrics.record_scheduled(item.seq, item.num_new_tokens, now)
        sample_rows = [
            i for i, item in enumerate(plan.scheduled)
            if item.seq.num_computed_tokens + item.num_new_tokens == len(item.seq.token_ids)
        ]
        prompt_rows = self._prompt_logprob_rows(plan.scheduled)
        try:
            logits = self.runner.execute(plan.scheduled, sample_rows, plan.copies, prompt_rows)
        except BaseException:
            self.scheduler.step_failed()
            raise
        if prompt_rows:
            logits = self._record_prompt_logprobs(plan.scheduled, prompt_rows, logits, len(sample_rows))
        self.scheduler.step_ran(plan)

        seqs, rows = [], []
        touched: dict[str, Request] = {}
        now = time.perf_counter()
        for row, i in enumerate(sample_rows):
            seq = plan.scheduled[i].seq
            if seq.request.beam is not None:
                advanced = beam_step(seq, logits[row], self.scheduler.fork, self._finish, self._decode_hypothesis)
                if advanced:
                    self.generation_tokens_total += advanced
                    seq.request.metrics.record_token(now)
                    touched[seq.request_id] = seq.request
                continue
            for sampled_seq in self._fork_if_first_sample(seq):
                seqs.append(sampled_seq)
                rows.append(row)
        if seqs:
            # A plain decode step samples every row once, in order: then the logits as they are, not a gathered
            # copy (32 rows of SmolLM2's vocabulary: 6 MB, ~1 ms of a ~50 ms bfloat16 step).
            picked = logits if rows == list(range(len(logits))) else logits[rows]
            result = sample(picked, seqs, self.structured.token_mask(seqs))
            for seq, token, logprobs, sampled_logprob in zip(seqs, result.token_ids, result.logprobs,
                                                             result.sampled_logprobs):
                self.structured.accept(seq, token)
                self._append_token(seq, token, logprobs, sampled_logprob, now)
                touched[seq.request_id] = seq.request
        outputs = failed
        for request in touched.values():
            if request.is_finished:
                request.metrics.finished_time = now
                del self.requests[request.request_id]
            outputs.append(RequestOutput.from_request(request))
        return outputs

    def _prompt_logprob_rows(self, scheduled: list) -> dict[int, tuple[int, int]]:
        """For the scheduled chunks of requests with prompt_logprobs: which of their tokens' logits this step
        must return, `{entry: (offset in its chunk, count)}`. The logits at position p give prompt token p + 1's
        logprob, so a chunk [start, end) covers tokens start + 1 .. min(end, prompt length - 1); positions done
        before (a chunk recomputed after a preemption) are not asked again. Empty for the plain step."""
        rows = {}
        for i, item in enumerate(scheduled):
            request, seq = item.seq.request, item.seq
            if request.prompt_logprobs is None:
                continue
            start = seq.num_computed_tokens
            first = max(start, len(request.prompt_logprobs) - 1)
            stop = min(start + item.num_new_tokens, seq.num_prompt_tokens - 1)
            if first < stop:
                rows[i] = (first - start, stop - first)
        return rows

    def _record_prompt_logprobs(self, scheduled: list, prompt_rows: dict[int, tuple[int, int]],
                                logits: torch.Tensor, num_sampled: int) -> torch.Tensor:
        """Append the prompt logprobs of this step's rows (after the `num_sampled` sampled rows of `logits`) to
        their requests, `PROMPT_LOGPROB_ROWS` rows at a time (a whole chunk's log-softmax at once would double
        its logits' memory); return the sampled rows' logits."""
        row = num_sampled
        decoded: dict[int, str] = {}

        def text(token: int) -> str:
            if token not in decoded:
                decoded[token] = self.tokenizer.decode([token])
            return decoded[token]

        for i, (offset, count) in prompt_rows.items():
            seq = scheduled[i].seq
            k = seq.request.params.prompt_logprobs
            first = seq.num_computed_tokens + offset + 1  # the prompt token the first row predicts
            for done in range(0, count, PROMPT_LOGPROB_ROWS):
                size = min(PROMPT_LOGPROB_ROWS, count - done)
                targets = seq.token_ids[first + done : first + done + size]
                chosen, ranks, top_ids, top_values = token_logprobs(logits[row + done : row + done + size],
                                                                     targets, k)
                for t, lp, rank, ids, values in zip(targets, chosen, ranks, top_ids, top_values):
                    entry = {t: Logprob(lp, rank, text(t))}
                    entry.update((tid, Logprob(v, r + 1, text(tid))) for r, (tid, v) in enumerate(zip(ids, values)))
                    seq.request.prompt_logprobs.append(entry)
            row += count
        return logits[:num_sampled]

    def _fail_uncompiled_grammars(self) -> list[RequestOutput]:
        """End the waiting requests whose grammar failed to compile (aborted, the error as stop reason)."""
        outputs = []
        for request in self.scheduler.waiting_requests():
            error = self.structured.compile_error(request)
            if error is not None:
                for seq in request.seqs:
                    self._finish(seq, "abort", error)
                request.metrics.finished_time = time.perf_counter()
                del self.requests[request.request_id]
                outputs.append(RequestOutput.from_request(request))
        return outputs

    def make_beam_request(self, request_id: str, prompt: str | dict, params: BeamSearchParams) -> Request:
        """Tokenise and validate a beam-search request (its output: the best `beam_width` hypotheses)."""
        return self.processor.make_beam_request(request_id, prompt, params)

    def add_beam_search(self, request_id: str, prompt: str | dict, params: BeamSearchParams) -> None:
        self.add(self.make_beam_request(request_id, prompt, params))

    def _fork_if_first_sample(self, seq: Sequence) -> list[Sequence]:
        """At a request's first sample, split the prefilled sequence into its n samples (shared blocks)."""
        request = seq.request
        if request.forked:
            return [seq]
        request.forked = True
        children = [request.new_sequence(index, list(seq.token_ids)) for index in range(1, request.params.n)]
        for child in children:
            self.scheduler.fork(seq, child)
            self.detokenizer.start(child)
            request.seqs.append(child)
        return [seq, *children]

    def _append_token(
        self, seq: Sequence, token: int, logprobs: dict[int, float] | None, sampled_logprob: float, now: float
    ) -> None:
        seq.token_ids.append(token)
        seq.cumulative_logprob += sampled_logprob
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        self.generation_tokens_total += 1
        seq.request.metrics.record_token(now, timed=seq.index == 0)
        stop_string = self.detokenizer.find_stop(seq, self.detokenizer.update(seq))
        stop = check_stop(seq, token, stop_string, self.structured.is_terminated(seq), self.max_model_len)
        if stop is not None:
            self._finish(seq, *stop)

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        if self.events.enabled:
            self.events.emit(Finished, request_id=seq.request_id, seq_id=seq.seq_id, reason=reason,
                             num_output_tokens=seq.num_output_tokens)
        self.scheduler.finish(seq, "aborted" if reason == "abort" else "finished")

    # --- figures --------------------------------------------------------------------------------

    def live_sequences(self) -> list[Sequence]:
        """The running sequences: the ones holding blocks."""
        return self.scheduler.running_sequences()

    def pool_view(self) -> PoolView:
        """The pool and the running sequences' block tables (inference/pool_view.py); O(blocks)."""
        return self.scheduler.view()

    def start_recording(self, limit: int) -> None:
        """Record every event from now on (at most `limit`), with the pool as it is now (a replay's start)."""
        initial = self.pool_view().to_initial()
        self.events.start_recording(Recording(self.runner.num_blocks, self.block_size, initial, limit))

    def stop_recording(self) -> Recording | None:
        return self.events.stop_recording()

    def contiguous_counterfactual(self) -> dict[str, dict[str, int]]:
        """What a contiguous allocator would reserve for the live requests in this pool, under both policies
        (inference/counterfactual.py): the one definition every view shows."""
        live = sorted(self.requests.values(), key=lambda r: r.arrival_time)
        wants = [(len(r.prompt_token_ids), r.params.max_tokens, sum(s.seats for s in r.seqs)) for r in live]
        return contiguous_admission(wants, self.runner.num_blocks, self.block_size, self.max_model_len)

    def check_integrity(self) -> None:
        """Check every block-accounting invariant (DESIGN.md), raising `IntegrityError`; cheap between steps."""
        self.scheduler.check_integrity()
        if not self.requests and self.scheduler.stats()["num_blocks_used"]:
            raise IntegrityError("idle engine holds blocks")

    def reset_prefix_cache(self) -> int:
        return self.scheduler.reset_prefix_cache()

    def metrics(self, block_map: bool = True) -> dict:
        """A plain dict of live figures (docs/metrics.md); `block_map=False` skips the per-block list and the
        block tables, O(blocks), for cheap sampling. Facts only: the dashboard shapes them for its pages."""
        figures = {"block_size": self.block_size, **self.scheduler.stats()}
        queries, hits = figures["prefix_cache_queries_total"], figures["prefix_cache_hits_total"]
        figures.update({
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            "weight_bytes": self.runner.weight_bytes,
            "kv_pool_bytes": self.runner.kv_pool_bytes,
            "kv_bytes_per_token": self.runner.kv_bytes_per_token,
            "tensor_parallel_size": self.runner.group.size,
            "weight_bytes_per_rank": self.runner.weight_bytes_per_rank,
            "kv_pool_bytes_per_rank": self.runner.kv_pool_bytes_per_rank,
            "quantization": self.runner.quantization_name,
            "contiguous": self.contiguous_counterfactual(),
        })
        if block_map:
            # Tables and map are taken together, in the engine's thread, so they agree.
            live = sorted(self.live_sequences(), key=lambda s: (s.request.arrival_time, s.request_id, s.index))
            figures["sequences"] = [self._sequence_figures(seq) for seq in live]
            figures["block_map"] = self.pool_view().block_map()
        return figures

    def _sequence_figures(self, seq: Sequence) -> dict:
        """One running sequence: its table, its computed context, and `max_len`, the tokens it may reach (what a
        contiguous allocator would reserve for it up front)."""
        max_tokens = seq.request.params.max_tokens
        max_len = self.max_model_len if max_tokens is None else min(seq.num_prompt_tokens + max_tokens,
                                                                     self.max_model_len)
        return {"request_id": seq.request_id, "index": seq.index,
                "adapter": None if seq.request.adapter is None else seq.request.adapter.name,
                "block_table": list(seq.block_table), "context_len": seq.num_computed_tokens, "max_len": max_len,
                "outside_window": self._blocks_outside_window(seq)}

    def _blocks_outside_window(self, seq: Sequence) -> int:
        """How many of `seq`'s first logical blocks every layer's sliding window has passed: kept (the block
        manager frees no block of a live sequence, docs/models.md) but never read again. 0 unless every layer is
        windowed: a full-attention layer reads every block."""
        windows = self.runner.cfg.windows
        if not windows or None in windows:
            return 0
        # The next query is at position context_len; it sees keys after context_len - window.
        return max(0, seq.num_computed_tokens - max(windows) + 1) // self.block_size
