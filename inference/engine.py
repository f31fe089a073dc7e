"""LLMEngine: requests in, one scheduler + forward + sampler step at a time, outputs out.

Single-threaded by design: every method must be called from one thread (the `LLM` caller, or the
`StreamingEngine` loop thread). See DESIGN.md "Engine step" for what `step()` does.
"""

from __future__ import annotations

import time
from pathlib import Path
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from inference.beam_search import BeamSearchParams, BeamState, advance
from inference.block_manager import BlockManager, IntegrityError
from inference.config import EngineArgs
from inference.counterfactual import contiguous_admission
from inference.detokenizer import Detokenizer
from inference.lora import LoRAAdapter, LoRAError, LoRARequest
from inference.events import EventLog, Finished, Recording, RequestAdded, hash_label
from inference.model_loader import resolve_model
from inference.model_runner import ModelRunner
from inference.outputs import RequestOutput
from inference.sampler import sample
from inference.sampling_params import SamplingParams
from inference.scheduler import Scheduler
from inference.sequence import Request, Sequence, SequenceStatus
from inference.structured_outputs import StructuredOutputManager


class LLMEngine:
    def __init__(self, args: EngineArgs, share_weights_with: LLMEngine | None = None) -> None:
        """`share_weights_with`: an engine whose loaded (maybe quantized) weights this one uses instead of
        loading its own (the lab's sandboxes share a worker's); this engine still gets its own KV pool,
        scheduler and block manager."""
        self.args = args
        folder = resolve_model(args.model)
        torch.manual_seed(args.seed)
        self.tokenizer = load_tokenizer(folder)
        self.runner = ModelRunner(args, folder, share_weights_with.runner if share_weights_with else None)
        try:
            self._start(args)
        except BaseException:
            self.close()  # a tensor-parallel runner's processes stop with the failed engine
            raise

    def _start(self, args: EngineArgs) -> None:
        """Everything but the weights and the KV pool: the block manager, the scheduler and their helpers."""
        self.block_size = args.block_size
        self.max_model_len = args.max_model_len
        if self.runner.num_blocks * args.block_size < args.max_model_len:
            raise ValueError(
                f"the KV pool holds {self.runner.num_blocks} blocks x {args.block_size} tokens, less than one "
                f"sequence of max_model_len={args.max_model_len}; raise the KV budget or lower max_model_len"
            )
        self.events = EventLog(args.event_log_capacity)
        self.block_manager = BlockManager(self.runner.num_blocks, args.block_size, args.enable_prefix_caching,
                                          self.events)
        self.scheduler = Scheduler(self.block_manager, args.max_num_seqs, args.max_num_batched_tokens,
                                   self.runner.lora)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.structured = StructuredOutputManager(self.tokenizer, self.runner.cfg.vocab_size)
        self.requests: dict[str, Request] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # --- requests -------------------------------------------------------------------------------

    def make_request(
        self,
        request_id: str,
        prompt: str | dict,
        params: SamplingParams,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> Request:
        """Tokenise and validate a request without touching engine state (safe from any thread).

        A `lora_request`'s adapter is read and checked here (from the host cache when it is there).
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, token_ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
        else:
            raise ValueError("a prompt must be a string or a dict with 'prompt_token_ids'")
        if not token_ids:
            raise ValueError("the prompt is empty")
        vocab = self.runner.cfg.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len}, "
                "which must leave room for at least one generated token"
            )
        if params.n > self.args.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.args.max_num_seqs}")
        adapter = self._adapter(lora_request)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.structured.request_grammar(params.structured_outputs)
        return Request(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=token_ids,
            params=params,
            eos_token_id=None if params.ignore_eos else self.eos_token_id,
            cache_salt=cache_salt,
            adapter=adapter,
            arrival_time=arrival_time if arrival_time is not None else time.perf_counter(),
            grammar=grammar,
        )

    def _adapter(self, lora_request: LoRARequest | None) -> LoRAAdapter | None:
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise LoRAError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if self.runner.lora is None:
            raise LoRAError("this engine was built without LoRA support; pass enable_lora=True")
        return self.runner.lora.get(lora_request)

    def add_request(
        self,
        request_id: str,
        prompt: str | dict,
        params: SamplingParams,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
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
            self.structured.wait_for_grammars(self.scheduler.waiting)
            return failed
        now = time.perf_counter()
        for item in plan.scheduled:
            seq = item.seq
            metrics = seq.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
            computed_prompt = max(0, min(seq.num_prompt_tokens, seq.num_computed_tokens + item.num_new_tokens)
                                  - seq.num_computed_tokens)
            metrics.num_computed_prompt_tokens += computed_prompt
            metrics.record_computed(seq, seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens)
            self.prompt_tokens_total += computed_prompt

        sample_rows = [
            i for i, item in enumerate(plan.scheduled)
            if item.seq.num_computed_tokens + item.num_new_tokens == len(item.seq.token_ids)
        ]
        try:
            logits = self.runner.execute(plan.scheduled, sample_rows, self.block_manager.take_pending_copies())
        except BaseException:
            self.block_manager.break_promises()
            raise
        self.block_manager.keep_promises()
        for item in plan.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(item.seq)

        seqs, rows = [], []
        touched: dict[str, Request] = {}
        for row, i in enumerate(sample_rows):
            seq = plan.scheduled[i].seq
            if seq.request.beam is not None:
                if self._beam_step(seq, logits[row]):
                    touched[seq.request_id] = seq.request
                continue
            for sampled_seq in self._fork_if_first_sample(seq):
                seqs.append(sampled_seq)
                rows.append(row)
        now = time.perf_counter()
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

    def _fail_uncompiled_grammars(self) -> list[RequestOutput]:
        """End the waiting requests whose grammar failed to compile (aborted, the error as stop reason)."""
        outputs = []
        for request in {seq.request_id: seq.request for seq in self.scheduler.waiting}.values():
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
        request = self.make_request(request_id, prompt, params.sampling_params())
        max_tokens = min(params.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        request.beam = BeamState(params, max_tokens)
        request.beam.scores[request.seqs[0].seq_id] = 0.0
        return request

    def add_beam_search(self, request_id: str, prompt: str | dict, params: BeamSearchParams) -> None:
        self.add(self.make_beam_request(request_id, prompt, params))

    def _beam_step(self, seq: Sequence, logits: torch.Tensor) -> bool:
        """Collect one beam's logits; once every live beam has its own, advance the search. True if advanced."""
        request, state = seq.request, seq.request.beam
        state.pending[seq.seq_id] = logits
        live = [s for s in request.seqs if not s.is_finished]
        if len(state.pending) < len(live):
            return False  # a preempted beam is still catching up
        request.forked = True
        scores = torch.tensor([state.scores[s.seq_id] for s in live], device=logits.device)
        stacked = torch.stack([state.pending.pop(s.seq_id) for s in live])
        continuations = advance(state, [s.output_token_ids for s in live], scores, stacked,
                                request.eos_token_id)
        now = time.perf_counter()
        self.generation_tokens_total += len(live)
        request.metrics.first_token_time = request.metrics.first_token_time or now
        request.metrics.last_token_time = now
        request.metrics.token_times.append(now)
        if state.done:
            for hypothesis in state.finished:
                hypothesis.text = self.tokenizer.decode(hypothesis.token_ids, skip_special_tokens=True)
            for beam in live:
                self._finish(beam, "stop")
            return True
        # Fork every parent chosen more than once before any beam appends its token (children copy the
        # parent's tokens as they are now); a parent chosen by nothing is freed.
        picks: dict[int, list[int]] = {}
        for c in continuations:
            picks.setdefault(c.parent_index, []).append(c)
        next_live: list[Sequence] = []
        for index, parent in enumerate(live):
            chosen = picks.get(index, [])
            if not chosen:
                self._finish(parent, "abort")
                continue
            for c in chosen[1:]:
                child = request.new_sequence(parent.index, list(parent.token_ids))
                self.block_manager.fork(parent, child)
                child.status = SequenceStatus.RUNNING
                self.scheduler.running.append(child)
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
        return True

    def _fork_if_first_sample(self, seq: Sequence) -> list[Sequence]:
        """At a request's first sample, split the prefilled sequence into its n samples (shared blocks)."""
        request = seq.request
        if request.forked:
            return [seq]
        request.forked = True
        children = []
        for index in range(1, request.params.n):
            child = request.new_sequence(index, list(seq.token_ids))
            self.block_manager.fork(seq, child)
            self.detokenizer.start(child)
            child.status = SequenceStatus.RUNNING
            request.seqs.append(child)
            self.scheduler.running.append(child)
            children.append(child)
        return [seq, *children]

    def _append_token(
        self, seq: Sequence, token: int, logprobs: dict[int, float] | None, sampled_logprob: float, now: float
    ) -> None:
        seq.token_ids.append(token)
        seq.cumulative_logprob += sampled_logprob
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        self.generation_tokens_total += 1
        metrics = seq.request.metrics
        if seq.index == 0:
            metrics.token_times.append(now)
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now

        params = seq.request.params
        new_text = self.detokenizer.update(seq)
        stop = self.detokenizer.find_stop(seq, new_text)
        num_out = seq.num_output_tokens
        if stop is not None:
            self._finish(seq, "stop", stop)
        elif num_out >= params.min_tokens and token == seq.request.eos_token_id:
            self._finish(seq, "stop")
        elif num_out >= params.min_tokens and token in params.stop_token_ids:
            self._finish(seq, "stop", token)
        elif self.structured.is_terminated(seq):
            self._finish(seq, "stop")
        elif params.max_tokens is not None and num_out >= params.max_tokens:
            self._finish(seq, "length")
        elif len(seq.token_ids) >= self.max_model_len:
            self._finish(seq, "length")

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
        return list(self.scheduler.running)

    def _max_len(self, seq: Sequence) -> int:
        """Tokens the sequence may reach: what a contiguous allocator would reserve for it up front."""
        max_tokens = seq.request.params.max_tokens
        if max_tokens is None:
            return self.max_model_len
        return min(seq.num_prompt_tokens + max_tokens, self.max_model_len)

    def start_recording(self, limit: int) -> None:
        """Record every event from now on (at most `limit`), with the pool as it is now (a replay's start)."""
        pool = self.block_manager.pool
        live = [s for s in self.scheduler.running if s.block_table]
        initial = {
            "ref_counts": [b.ref_count for b in pool.blocks],
            "hashes": [hash_label(b.block_hash) for b in pool.blocks],
            "tables": {str(s.seq_id): list(s.block_table) for s in live},
            "owners": {str(s.seq_id): s.request_id for s in live},
        }
        self.events.start_recording(Recording(pool.num_blocks, self.block_size, initial, limit))

    def stop_recording(self) -> Recording | None:
        return self.events.stop_recording()

    def contiguous_counterfactual(self) -> dict[str, dict[str, int]]:
        """What a contiguous allocator would reserve for the live requests in this pool, under both policies
        (inference/counterfactual.py): the one definition every view shows."""
        live = sorted(self.requests.values(), key=lambda r: r.arrival_time)
        wants = [(len(r.prompt_token_ids), r.params.max_tokens, len(r.seqs) if r.forked else r.params.n)
                 for r in live]
        return contiguous_admission(wants, self.block_manager.pool.num_blocks, self.block_size, self.max_model_len)

    def check_integrity(self) -> None:
        """Check every block-accounting invariant (DESIGN.md), raising `IntegrityError`; cheap between steps."""
        self.block_manager.check_integrity(self.live_sequences())
        if not self.requests and self.block_manager.pool.num_used_blocks:
            raise IntegrityError("idle engine holds blocks")

    def reset_prefix_cache(self) -> int:
        return self.block_manager.pool.reset_prefix_cache()

    def metrics(self, block_map: bool = True) -> dict:
        """A plain dict of live figures; `block_map=False` skips the per-block list for cheap sampling."""
        pool, bs = self.block_manager.pool, self.block_size
        num_used, num_cached = pool.num_used_blocks, pool.num_cached_blocks
        queries, hits = self.scheduler.prefix_cache_queries, self.scheduler.prefix_cache_hits
        figures = {
            "block_size": bs,
            "num_blocks_total": pool.num_blocks,
            "num_blocks_used": num_used,
            "num_blocks_free": pool.num_blocks - num_used - num_cached,
            "num_blocks_cached": num_cached,
            "num_blocks_shared": pool.num_shared_blocks,
            "kv_cache_usage": num_used / pool.num_blocks,
            "kv_slot_utilization": self._filled_slots() / (num_used * bs) if num_used else 1.0,
            "num_requests_running": len({s.request_id for s in self.scheduler.running}),
            "num_requests_waiting": len({s.request_id for s in self.scheduler.waiting}
                                        - {s.request_id for s in self.scheduler.running}),
            "num_preemptions_total": self.scheduler.num_preemptions,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "prefix_cache_queries_total": queries,
            "prefix_cache_hits_total": hits,
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            "evictions_total": pool.num_evictions,
            "cow_copies_total": self.block_manager.num_cow_copies,
            "weight_bytes": self.runner.weight_bytes,
            "kv_pool_bytes": self.runner.kv_pool_bytes,
            "tensor_parallel_size": self.runner.group.size,
            "weight_bytes_per_rank": self.runner.weight_bytes_per_rank,
            "kv_pool_bytes_per_rank": self.runner.kv_pool_bytes_per_rank,
            "quantization": self.runner.quantization_name,
            "contiguous": self.contiguous_counterfactual(),
        }
        if block_map:
            owners: dict[int, list[str]] = {}
            for seq in self.scheduler.running:
                for block_id in seq.block_table:
                    holders = owners.setdefault(block_id, [])
                    if seq.request_id not in holders:
                        holders.append(seq.request_id)
            # Block tables are snapshotted here, in the engine's thread, so they agree with the block map.
            figures["sequences"] = [
                {
                    "request_id": seq.request_id,
                    "index": seq.index,
                    "adapter": None if seq.request.adapter is None else seq.request.adapter.name,
                    "block_table": list(seq.block_table),
                    "context_len": seq.num_computed_tokens,
                    "max_len": self._max_len(seq),
                }
                for seq in sorted(self.scheduler.running,
                                  key=lambda s: (s.request.arrival_time, s.request_id, s.index))
            ]
            figures["block_map"] = [
                {
                    "state": "used" if b.ref_count else ("cached" if b.block_hash is not None else "free"),
                    "ref_count": b.ref_count,
                    "owners": owners.get(b.block_id, []),
                }
                for b in pool.blocks
            ]
        return figures


    def _filled_slots(self) -> int:
        """Slots of the running sequences' blocks that hold computed tokens, each block counted once however
        many sequences share it: every block before a sequence's last computed position is full. Cheap (set
        updates per sequence, not a loop per block), since the bench and the dashboard sample it every step."""
        bs = self.block_size
        full: set[int] = set()
        partial: dict[int, int] = {}
        for seq in self.scheduler.running:
            table, computed = seq.block_table, seq.num_computed_tokens
            num_full = min(len(table), computed // bs)
            full.update(table[:num_full])
            if num_full < len(table) and computed > num_full * bs:
                block_id = table[num_full]
                partial[block_id] = max(partial.get(block_id, 0), computed - num_full * bs)
        return bs * len(full) + sum(tokens for block_id, tokens in partial.items() if block_id not in full)


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The model's own tokenizer and chat template; fails clearly when the folder has none."""
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: cannot load a tokenizer ({exc})") from exc
