"""Engine events: one typed record for each thing a step did to memory or to a request.

The block manager, the scheduler and the engine emit into one `EventLog`; the memory view, the lab and
replays all read the same records. Every event carries the step that produced it (`EventLog.step`, set by
the engine at the start of each `step()`; what happens between steps, such as adding or aborting a request,
carries the number of the step before it, 0 before the first) and a `perf_counter` time. Steps never go back,
so a recording is ordered by step.

Invariant (tested): applying a run's events in order to an empty `BlockMapReplay` reproduces, after every
step, exactly the block manager's `PoolView` (inference/pool_view.py): the pool's ref counts, block hashes
and every live sequence's block table and owner. For that the events describe every change of ref count and
table:
    allocated       a block left the free queue for `seq`'s logical block `index` (ref count 1); appended,
                    or, after a copy-on-write, replacing the shared block at `index`
    touched         a cached or shared block gained a reference as `seq`'s logical block `index` (a prefix
                    hit when the sequence was admitted)
    forked          `child` took the parent's whole table by reference (n > 1 samples, beam search)
    copy_on_write   `seq` stopped sharing its partial last block: `dst` (allocated just before) replaces
                    `src`, whose reference is dropped (the copy itself runs before the forward)
    freed           `seq` dropped every reference it held (finish, abort, preemption)
    cached          a full, computed block was registered under its hash
    evicted         a cached block lost its hash because the pool reused it
    cache_reset     the prefix cache was emptied (blocks lose their hashes, nothing else changes)

Recording is cheap when nobody listens: emitters check `EventLog.enabled` before building a record.

Besides the ring buffer, a *recording* keeps every event from a moment on (up to a limit) together with the
pool's state at that moment, so that a replay can start mid-run (a live worker's): `BlockMapReplay` starts
from that state instead of an empty pool. A recording that hit its limit says so (`truncated`) and keeps
nothing after it, so what it holds stays replayable.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from inference.pool_view import PoolView


def hash_label(block_hash: object) -> str | None:
    """A block hash as a short, JSON-safe label (hashes are ints or bytes depending on the hasher)."""
    if block_hash is None:
        return None
    if isinstance(block_hash, bytes):
        return block_hash.hex()[:16]
    return format(block_hash & 0xFFFF_FFFF_FFFF_FFFF, "016x")


@dataclass(frozen=True)
class EngineEvent:
    kind: ClassVar[str] = "event"
    step: int
    time: float

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def describe(self) -> str:
        """One plain-language sentence for the lab's timeline."""
        raise NotImplementedError


@dataclass(frozen=True)
class RequestAdded(EngineEvent):
    kind: ClassVar[str] = "request_added"
    request_id: str
    seq_id: int
    num_prompt_tokens: int
    n: int

    def describe(self) -> str:
        samples = f", {self.n} samples" if self.n > 1 else ""
        return f"request {self.request_id} arrived with {self.num_prompt_tokens} prompt tokens{samples}"


@dataclass(frozen=True)
class ScheduledSeq:
    seq_id: int
    request_id: str
    num_new_tokens: int
    phase: str  # "prefill" or "decode"


@dataclass(frozen=True)
class Scheduled(EngineEvent):
    kind: ClassVar[str] = "scheduled"
    seqs: tuple[ScheduledSeq, ...]

    def describe(self) -> str:
        tokens = sum(s.num_new_tokens for s in self.seqs)
        decodes = sum(s.phase == "decode" for s in self.seqs)
        return (f"step {self.step}: {len(self.seqs)} sequences, {tokens} tokens "
                f"({decodes} decodes, {len(self.seqs) - decodes} prefill chunks)")


@dataclass(frozen=True)
class BlockAllocated(EngineEvent):
    kind: ClassVar[str] = "allocated"
    request_id: str
    seq_id: int
    index: int
    block_id: int

    def describe(self) -> str:
        return f"request {self.request_id} got physical block {self.block_id} for its logical block {self.index}"


@dataclass(frozen=True)
class BlockTouched(EngineEvent):
    kind: ClassVar[str] = "touched"
    request_id: str
    seq_id: int
    index: int
    block_id: int
    block_hash: str | None

    def describe(self) -> str:
        return (f"request {self.request_id} reused cached block {self.block_id} as its logical block "
                f"{self.index} (prefix cache hit: those tokens are not recomputed)")


@dataclass(frozen=True)
class Forked(EngineEvent):
    kind: ClassVar[str] = "forked"
    request_id: str
    parent_seq_id: int
    child_seq_id: int
    block_ids: tuple[int, ...]

    def describe(self) -> str:
        return (f"request {self.request_id} forked a new sample sharing all {len(self.block_ids)} blocks by "
                "reference (nothing is copied until one of them writes)")


@dataclass(frozen=True)
class CopyOnWrite(EngineEvent):
    kind: ClassVar[str] = "copy_on_write"
    request_id: str
    seq_id: int
    index: int
    src_block_id: int
    dst_block_id: int

    def describe(self) -> str:
        return (f"request {self.request_id} was about to write into shared block {self.src_block_id}: copied "
                f"it to block {self.dst_block_id} (copy-on-write)")


@dataclass(frozen=True)
class BlocksFreed(EngineEvent):
    kind: ClassVar[str] = "freed"
    request_id: str
    seq_id: int
    block_ids: tuple[int, ...]
    reason: str  # "finished", "aborted" or "preempted"

    def describe(self) -> str:
        return f"request {self.request_id} ({self.reason}) released {len(self.block_ids)} blocks"


@dataclass(frozen=True)
class BlockCached(EngineEvent):
    kind: ClassVar[str] = "cached"
    block_id: int
    block_hash: str

    def describe(self) -> str:
        return f"block {self.block_id} is full: registered in the prefix cache as {self.block_hash[:8]}"


@dataclass(frozen=True)
class BlockEvicted(EngineEvent):
    kind: ClassVar[str] = "evicted"
    block_id: int
    block_hash: str

    def describe(self) -> str:
        return (f"no never-used block was left: evicted cached block {self.block_id} "
                "(the least recently released) for reuse")


@dataclass(frozen=True)
class CacheReset(EngineEvent):
    kind: ClassVar[str] = "cache_reset"
    block_ids: tuple[int, ...]

    def describe(self) -> str:
        return f"the prefix cache was reset: {len(self.block_ids)} cached blocks forgotten"


@dataclass(frozen=True)
class Preempted(EngineEvent):
    kind: ClassVar[str] = "preempted"
    request_id: str
    seq_id: int
    for_request_id: str
    blocks_needed: int
    blocks_free: int
    rule: str  # "newest running" or "no other victim"

    def describe(self) -> str:
        victim = ("the newest running request" if self.rule == "newest running"
                  else "itself, since no other running request could make room")
        return (f"request {self.for_request_id} needed {self.blocks_needed} blocks, {self.blocks_free} were "
                f"free: preempted {self.request_id}, {victim}; it will be recomputed later")


@dataclass(frozen=True)
class Finished(EngineEvent):
    kind: ClassVar[str] = "finished"
    request_id: str
    seq_id: int
    reason: str
    num_output_tokens: int

    def describe(self) -> str:
        return f"request {self.request_id} finished ({self.reason}) after {self.num_output_tokens} tokens"


EVENT_TYPES: dict[str, type[EngineEvent]] = {
    cls.kind: cls
    for cls in (RequestAdded, Scheduled, BlockAllocated, BlockTouched, Forked, CopyOnWrite, BlocksFreed,
                BlockCached, BlockEvicted, CacheReset, Preempted, Finished)
}


RECORDING_FORMAT = "paged-playground-recording/1"


@dataclass
class Recording:
    """Events from `initial` (the pool at the start, `PoolView.to_initial`) on."""

    num_blocks: int
    block_size: int
    initial: dict
    limit: int
    events: list[EngineEvent] = field(default_factory=list)
    truncated: bool = False

    def to_dict(self) -> dict:
        return {
            "format": RECORDING_FORMAT, "num_blocks": self.num_blocks, "block_size": self.block_size,
            "initial": self.initial, "truncated": self.truncated,
            "events": [{**e.to_dict(), "text": e.describe()} for e in self.events],
        }


def event_from_dict(data: dict) -> EngineEvent:
    """The inverse of `EngineEvent.to_dict` (a recording's JSON back into typed events)."""
    try:
        cls = EVENT_TYPES[data["kind"]]
    except KeyError:
        raise ValueError(f"unknown engine event kind {data.get('kind')!r}") from None
    values = {f.name: data[f.name] for f in fields(cls)}
    if cls is Scheduled:
        values["seqs"] = tuple(ScheduledSeq(**s) for s in values["seqs"])
    if "block_ids" in values:
        values["block_ids"] = tuple(values["block_ids"])
    return cls(**values)


class EventLog:
    """A bounded ring buffer of the newest events plus push listeners; the engine's single sink.

    `enabled` is False when the buffer has no room and nobody listens: emitters then build nothing.
    Listeners run in the engine's thread and must be quick (hand the event to a queue).
    """

    def __init__(self, capacity: int = 0) -> None:
        self.step = 0
        self.capacity = capacity
        self.events: deque[EngineEvent] = deque(maxlen=capacity or 1)
        self.listeners: list[Callable[[EngineEvent], None]] = []
        self.num_dropped = 0
        self.recording: Recording | None = None

    @property
    def enabled(self) -> bool:
        return self.capacity > 0 or bool(self.listeners) or self.recording is not None

    def start_recording(self, recording: Recording) -> None:
        self.recording = recording

    def stop_recording(self) -> Recording | None:
        recording, self.recording = self.recording, None
        return recording

    def record(self, capacity: int) -> None:
        """Keep the newest `capacity` events from now on (0 stops recording and clears the buffer)."""
        self.capacity = capacity
        self.events = deque(self.events if capacity else (), maxlen=capacity or 1)

    def emit(self, cls: type[EngineEvent], **values) -> None:
        event = cls(step=self.step, time=time.perf_counter(), **values)
        if self.capacity:
            if len(self.events) == self.capacity:
                self.num_dropped += 1
            self.events.append(event)
        recording = self.recording
        if recording is not None and not recording.truncated:
            if len(recording.events) < recording.limit:
                recording.events.append(event)
            else:
                recording.truncated = True
        for listener in self.listeners:
            listener(event)

    def since(self, step: int) -> list[EngineEvent]:
        """Buffered events from `step` on, oldest first."""
        return [e for e in self.events if e.step >= step]


class BlockMapReplay:
    """The pool's `PoolView` rebuilt from events alone: what a recording shows at any step."""

    def __init__(self, view: PoolView) -> None:
        self.view = view

    @classmethod
    def starting_from(cls, num_blocks: int, initial: dict | None) -> BlockMapReplay:
        """A replay from a recording's initial pool (`PoolView.to_initial`), or from an empty pool."""
        return cls(PoolView.from_initial(initial) if initial else PoolView.empty(num_blocks))

    def apply(self, event: EngineEvent) -> None:
        view = self.view
        if isinstance(event, BlockAllocated):
            table = view.tables.setdefault(event.seq_id, [])
            view.owners[event.seq_id] = event.request_id
            if event.index == len(table):
                table.append(event.block_id)
            else:
                table[event.index] = event.block_id
            view.ref_counts[event.block_id] = 1
        elif isinstance(event, BlockTouched):
            view.tables.setdefault(event.seq_id, []).append(event.block_id)
            view.owners[event.seq_id] = event.request_id
            view.ref_counts[event.block_id] += 1
        elif isinstance(event, Forked):
            view.tables[event.child_seq_id] = list(event.block_ids)
            view.owners[event.child_seq_id] = event.request_id
            for block_id in event.block_ids:
                view.ref_counts[block_id] += 1
        elif isinstance(event, CopyOnWrite):
            view.ref_counts[event.src_block_id] -= 1
        elif isinstance(event, BlocksFreed):
            for block_id in event.block_ids:
                view.ref_counts[block_id] -= 1
            view.tables.pop(event.seq_id, None)
            view.owners.pop(event.seq_id, None)
        elif isinstance(event, BlockCached):
            view.hashes[event.block_id] = event.block_hash
        elif isinstance(event, BlockEvicted):
            view.hashes[event.block_id] = None
        elif isinstance(event, CacheReset):
            for block_id in event.block_ids:
                view.hashes[block_id] = None


def replay_steps(num_blocks: int, events: Iterable[EngineEvent], initial: dict | None = None
                 ) -> dict[int, PoolView]:
    """The replayed pool view as it stood at the end of every step that appears in `events`, starting from
    `initial` (a recording's) or an empty pool. Returns copies keyed by step, so a slider can jump to any.
    """
    replay = BlockMapReplay.starting_from(num_blocks, initial)
    states: dict[int, PoolView] = {}
    current = None
    for event in events:
        if current is not None and event.step != current:
            states[current] = replay.view.copy()
        current = event.step
        replay.apply(event)
    if current is not None:
        states[current] = replay.view.copy()
    return states
