"""Continuous batching: choose each step's work under the token and sequence budgets.

Every step, in this order:
1. Running sequences, decodes first, then unfinished prefill chunks. When one cannot get a block, the
   newest running sequence not yet scheduled this step is preempted (its blocks freed; it waits at the
   head of the queue to be recomputed later, mostly from the prefix cache) until it fits. If nothing
   else can go, the sequence preempts itself.
2. Waiting sequences, first come first served, while the budgets and free blocks allow (none are
   admitted in a step that preempted, so memory pressure is not made worse). A prompt larger than the
   remaining token budget is prefilled in chunks over several steps (chunked prefill), so a long prompt
   never stalls the running decodes. With LoRA, a sequence is admitted only once its adapter holds a
   device slot; one whose adapter cannot get a slot yet (every slot serves running sequences) is passed
   over, keeping its place in line, while sequences of the base model or of resident adapters go ahead.
   A request whose grammar is still compiling (structured outputs) is passed over the same way until it
   is ready. Blocks a prefill fills in this step are registered in the prefix cache as it is scheduled
   (`BlockManager.promise_blocks`), so requests behind it that share them (a system prompt sent by many
   users at once) map them in the same step and compute only the rest. A request whose next uncached
   blocks, for at least half of what it would compute, are blocks a running prefill computes in a *later*
   step (a chunked prompt) is passed over until they are cached, instead of computing the same K/V twice.

The scheduler owns its queues and the block manager behind them: the engine adds, forks and finishes
sequences through it (`add`, `fork`, `finish`), hands it each step's outcome (`step_ran`, `step_failed`) and
reads figures (`stats`, `view`, `running_sequences`, `waiting_requests`), never `running`, `waiting` or the
pool directly. Invariant: a sequence is in `running` iff its status is RUNNING, and only running sequences
hold blocks (`check_integrity`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inference.block_manager import BlockManager, IntegrityError
from inference.lora_slots import LoRAManager
from inference.events import Preempted, Scheduled
from inference.events import ScheduledSeq as ScheduledEntry
from inference.pool_view import PoolView
from inference.sequence import Request, Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Copy-on-write (src, dst) block pairs the runner must copy before this step's forward.
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 lora: LoRAManager | None = None) -> None:
        self.block_manager = block_manager
        self.lora = lora
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # --- the queues -------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start `child` running beside its running `parent`, sharing all of its blocks (a sample or a beam)."""
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)

    def finish(self, seq: Sequence, reason: str = "finished") -> None:
        """Take a finished or aborted sequence out of the queues and drop its block references."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq, reason)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def running_sequences(self) -> list[Sequence]:
        """The running sequences (the ones holding blocks) in the order they started running; a copy."""
        return list(self.running)

    def waiting_requests(self) -> list[Request]:
        """The requests with a waiting sequence, in queue order, each once."""
        return list({seq.request_id: seq.request for seq in self.waiting}.values())

    def _seats_taken(self) -> int:
        return sum(seq.seats for seq in self.running)

    # --- a step -----------------------------------------------------------------------------------

    def step_ran(self, out: SchedulerOutput) -> None:
        """The step's forward ran: its tokens are computed, and the blocks they filled hold their K/V."""
        self.block_manager.keep_promises()
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(item.seq)

    def step_failed(self) -> None:
        """The step's forward failed: no block it promised to the prefix cache may be found there."""
        self.block_manager.break_promises()

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        order = sorted(self.running, key=lambda s: s.num_uncomputed_tokens != 1)  # decodes first, stable
        for seq in order:
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if num_new == 0:
                continue  # a beam whose logits wait for its siblings
            while not self.block_manager.allocate(seq, num_new):
                victim = next(
                    (v for v in reversed(self.running) if v is not seq and v.seq_id not in scheduled_ids), None
                )
                if self.block_manager.events.enabled:
                    rule = "newest running" if victim else "no other victim"
                    self._emit_preemption(victim or seq, seq, num_new, rule)
                self._preempt(victim or seq, out)
                if victim is None:
                    break
            if seq.status is SequenceStatus.RUNNING:
                out.scheduled.append(ScheduledSeq(seq, num_new))
                scheduled_ids.add(seq.seq_id)
                budget -= num_new
                self.block_manager.promise_blocks(seq, num_new)

        in_flight = self._prefill_blocks_in_flight() if self.waiting else set()
        for seq in list(self.waiting):
            if budget == 0 or out.preempted:
                break
            if not seq.request.grammar_ready:
                continue  # its grammar is still compiling; those behind it need not wait for it
            if self._seats_taken() + seq.seats > self.max_num_seqs:
                break
            cached = self.block_manager.find_cached_prefix(seq)
            num_new = min(len(seq.token_ids) - len(cached) * self.block_manager.block_size, budget)
            if not self.block_manager.can_admit(seq, cached, num_new):
                break
            if self._prefix_in_flight(seq, cached, in_flight):
                continue  # a step later its prefix is cached; it keeps its place in line
            if not self._adapter_ready(seq):
                continue  # its adapter waits for a device slot; it keeps its place in line
            self.waiting.remove(seq)
            self.block_manager.admit(seq, cached)
            if not self.block_manager.allocate(seq, num_new):  # can_admit said it fits
                raise IntegrityError(f"seq {seq.seq_id} was admitted but its first chunk could not be allocated")
            self._count_prefix_query(seq, len(cached))
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            self.block_manager.promise_blocks(seq, num_new)  # the sequences behind it may map them now
            in_flight.update(self.block_manager.prompt_blocks_to_compute(seq))
        if out.scheduled and self.block_manager.events.enabled:
            self.block_manager.events.emit(Scheduled, seqs=tuple(
                ScheduledEntry(s.seq.seq_id, s.seq.request_id, s.num_new_tokens,
                               "decode" if s.seq.num_computed_tokens >= s.seq.num_prompt_tokens else "prefill")
                for s in out.scheduled
            ))
        out.copies = self.block_manager.take_pending_copies()
        return out

    def _prefill_blocks_in_flight(self) -> set[int]:
        """Hashes of the prompt blocks that running prefills are computing (not cached yet)."""
        return {h for seq in self.running if seq.num_computed_tokens < seq.num_prompt_tokens
                for h in self.block_manager.prompt_blocks_to_compute(seq)}

    def _prefix_in_flight(self, seq: Sequence, cached: list[int], in_flight: set[int]) -> bool:
        """Whether at least half of the tokens `seq` would compute lie in blocks, right after its cached
        prefix, that a running prefill is computing now. Waiting costs it one step (or as many as that
        prefill's chunks), so a block or two of a short shared header is not worth it; most of a prompt is."""
        if not in_flight or not seq.request.reads_prefix_cache:
            return False
        bs = self.block_manager.block_size
        shared = 0
        for block_hash in seq.block_hashes[len(cached) : (len(seq.token_ids) - 1) // bs]:
            if block_hash not in in_flight:
                break
            shared += 1
        return shared > 0 and 2 * shared * bs >= len(seq.token_ids) - len(cached) * bs

    def _adapter_ready(self, seq: Sequence) -> bool:
        """Whether the sequence's adapter (if any) is in a device slot, loading it into a free one if it can."""
        adapter = seq.request.adapter
        if adapter is None:
            return True
        in_use = (s.request.adapter.digest for s in self.running if s.request.adapter is not None)
        return self.lora.acquire(adapter, in_use)

    def _emit_preemption(self, victim: Sequence, needy: Sequence, num_new: int, rule: str) -> None:
        """Record why a sequence is about to be preempted: the allocation that failed and the victim rule."""
        self.block_manager.events.emit(
            Preempted, request_id=victim.request_id, seq_id=victim.seq_id, for_request_id=needy.request_id,
            blocks_needed=self.block_manager.num_blocks_needed(needy, num_new),
            blocks_free=self.block_manager.num_free_blocks, rule=rule,
        )

    def _count_prefix_query(self, seq: Sequence, num_cached_blocks: int) -> None:
        hit_tokens = num_cached_blocks * self.block_manager.block_size
        self.prefix_cache_queries += len(seq.token_ids)
        self.prefix_cache_hits += hit_tokens
        metrics = seq.request.metrics
        if metrics.first_scheduled_time is None:
            metrics.num_cached_tokens = hit_tokens
        metrics.record_cache_hit(seq.num_prompt_tokens, hit_tokens)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free the sequence's blocks and queue it first in line; it is recomputed on readmission."""
        self.block_manager.free(seq, "preempted")
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        seq.request.metrics.num_preemptions += 1
        out.preempted.append(seq)

    # --- figures and checks -----------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """The queues' and the pool's counters (named as `LLMEngine.metrics()` reports them); cheap."""
        running = {s.request_id for s in self.running}
        return {
            **self.block_manager.stats(self.running),
            "num_requests_running": len(running),
            "num_requests_waiting": len({s.request_id for s in self.waiting} - running),
            "num_preemptions_total": self.num_preemptions,
            "prefix_cache_queries_total": self.prefix_cache_queries,
            "prefix_cache_hits_total": self.prefix_cache_hits,
        }

    def view(self) -> PoolView:
        """The pool with the running sequences' tables (`BlockManager.view`)."""
        return self.block_manager.view(self.running)

    def reset_prefix_cache(self) -> int:
        return self.block_manager.reset_prefix_cache()

    def check_integrity(self) -> None:
        """The block manager's invariants over the running sequences, and that no waiting one holds blocks."""
        for seq in self.waiting:
            if seq.block_table or seq.status is not SequenceStatus.WAITING:
                raise IntegrityError(f"waiting seq {seq.seq_id} is {seq.status.name} with blocks {seq.block_table}")
        for seq in self.running:
            if seq.status is not SequenceStatus.RUNNING:
                raise IntegrityError(f"seq {seq.seq_id} is in the running queue but {seq.status.name}")
        self.block_manager.check_integrity(self.running)
