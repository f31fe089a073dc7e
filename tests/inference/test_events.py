"""The engine event log: exact events for scripted block operations, and a replay of a real engine run
that reproduces the pool's block map after every step (the log's accounting equals the pool's)."""

import json

import pytest

from inference import LLM, SamplingParams
from inference.block_manager import BlockManager
from inference.events import (
    BlockAllocated, BlockCached, BlockEvicted, BlocksFreed, BlockTouched, CopyOnWrite, EventLog, Forked,
    Preempted, Recording, Scheduled, event_from_dict, replay_steps,
)
from inference.sampling_params import SamplingParams as Params
from inference.sequence import Request


def make_seq(tokens, request_id="r", n=1):
    return Request(request_id, None, list(tokens), Params(n=n), eos_token_id=None).seqs[0]


def compute(bm, seq, num_tokens):
    assert bm.allocate(seq, num_tokens)
    bm.take_pending_copies()
    seq.num_computed_tokens += num_tokens
    bm.cache_full_blocks(seq)


def summary(events):
    """(kind, the fields that matter) per event, so expected sequences read as a script."""
    rows = []
    for e in events:
        if isinstance(e, BlockAllocated):
            rows.append(("allocated", e.request_id, e.index, e.block_id))
        elif isinstance(e, BlockTouched):
            rows.append(("touched", e.request_id, e.index, e.block_id))
        elif isinstance(e, BlockCached):
            rows.append(("cached", e.block_id))
        elif isinstance(e, BlockEvicted):
            rows.append(("evicted", e.block_id))
        elif isinstance(e, Forked):
            rows.append(("forked", e.block_ids))
        elif isinstance(e, CopyOnWrite):
            rows.append(("cow", e.src_block_id, e.dst_block_id))
        elif isinstance(e, BlocksFreed):
            rows.append(("freed", e.request_id, e.block_ids, e.reason))
    return rows


def test_scripted_block_operations_emit_exact_events():
    log = EventLog(capacity=100)
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True, events=log)
    a = make_seq(range(6), "a")
    compute(bm, a, 6)                       # blocks 0 (full, cached) and 1 (2 of 4 tokens)
    child = a.request.new_sequence(1, list(a.token_ids))
    bm.fork(a, child)                       # shares 0 and 1
    child.token_ids.append(99)
    compute(bm, child, 1)                   # writes into shared block 1: copy-on-write into 2
    bm.free(child)
    bm.free(a)
    b = make_seq([0, 1, 2, 3, 7, 7, 7, 7, 7], "b")  # a's first block again: a prefix hit on block 0
    bm.admit(b, bm.find_cached_prefix(b))
    compute(bm, b, 5)                       # free queue [1, 2, 3, 0]: uncached blocks first
    bm.free(b)
    c = make_seq([5] * 9, "c")
    compute(bm, c, 9)                       # 2 and 3 are never-used; then the LRU cached block 1 is evicted
    assert summary(log.events) == [
        ("allocated", "a", 0, 0), ("allocated", "a", 1, 1), ("cached", 0),
        ("forked", (0, 1)),
        ("allocated", "a", 1, 2), ("cow", 1, 2),
        ("freed", "a", (0, 2), "finished"), ("freed", "a", (0, 1), "finished"),
        ("touched", "b", 0, 0), ("allocated", "b", 1, 1), ("allocated", "b", 2, 2), ("cached", 1),
        ("freed", "b", (0, 1, 2), "finished"),
        ("allocated", "c", 0, 2), ("allocated", "c", 1, 3), ("evicted", 1), ("allocated", "c", 2, 1),
        ("cached", 2), ("cached", 3),
    ]
    replayed = replay_steps(4, log.events)[0]
    assert replayed.tables == {c.seq_id: [2, 3, 1]} and replayed.ref_counts == [0, 1, 1, 1]
    bm.check_integrity([c])


def test_nothing_is_built_when_nobody_listens():
    log = EventLog()
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True, events=log)
    compute(bm, make_seq(range(6)), 6)
    assert not log.enabled and list(log.events) == []
    heard = []
    log.listeners.append(heard.append)
    compute(bm, make_seq(range(3), "x"), 3)
    assert [type(e) for e in heard] == [BlockAllocated] and list(log.events) == []


def test_ring_buffer_keeps_the_newest_events():
    log = EventLog(capacity=3)
    for step in range(5):
        log.step = step
        log.emit(BlockCached, block_id=step, block_hash="h")
    assert [e.block_id for e in log.events] == [2, 3, 4] and log.num_dropped == 2
    assert [e.block_id for e in log.since(4)] == [4]


def pool_state(engine):
    pool = engine.block_manager.pool
    tables = {s.seq_id: list(s.block_table) for s in engine.scheduler.running if s.block_table}
    return [b.ref_count for b in pool.blocks], [b.block_hash is not None for b in pool.blocks], tables


@pytest.mark.slow
def test_replay_reproduces_the_block_map_after_every_step():
    """A tiny pool under pressure: prefix hits, n=3 forks with copy-on-write, preemption, eviction, abort."""
    llm = LLM(num_kv_blocks=10, block_size=8, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64,
              event_log_capacity=100_000)
    engine = llm.llm_engine
    shared = "You are a helpful assistant. Answer briefly."
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("a", shared + " Hi", greedy)
    engine.add_request("b", shared + " Bye", greedy)
    engine.add_request("c", "Count: 1, 2, 3", SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=20,
                                                              ignore_eos=True))
    expected = {}
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 3:
            engine.add_request("d", shared + " Hi", greedy)  # arrives late: a prefix hit on a's blocks
        if steps == 6:
            engine.abort_request("b")
        expected[engine.events.step] = pool_state(engine)
        engine.check_integrity()
    recording = [event_from_dict(json.loads(json.dumps(e.to_dict()))) for e in engine.events.events]
    assert recording == list(engine.events.events)  # the JSON export round-trips exactly
    replayed = replay_steps(engine.runner.num_blocks, recording)
    for step, (refs, hashed, tables) in expected.items():
        state = replayed[step]
        assert state.ref_counts == refs, f"step {step}"
        assert [h is not None for h in state.hashes] == hashed, f"step {step}"
        assert state.tables == tables, f"step {step}"
    kinds = {e.kind for e in recording}
    assert {"touched", "forked", "copy_on_write", "preempted", "evicted", "finished"} <= kinds
    preemption = next(e for e in recording if isinstance(e, Preempted))
    assert preemption.blocks_needed > preemption.blocks_free
    assert "preempted" in preemption.describe() and preemption.for_request_id in preemption.describe()
    scheduled = [e for e in recording if isinstance(e, Scheduled)]
    assert [e.step for e in scheduled] == sorted({e.step for e in scheduled})  # one per step that ran work
    assert all(e.describe() for e in recording)
    assert all(r == 0 for r in replayed[max(replayed)].ref_counts)


@pytest.mark.slow
def test_a_recording_started_mid_run_replays_from_its_initial_pool():
    """A live worker's recording: begun while requests hold blocks, limited in length, still replayable."""
    llm = LLM(num_kv_blocks=16, block_size=8, max_model_len=64, max_num_seqs=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("early", "The quick brown fox jumps over the lazy dog", params)
    for _ in range(3):
        engine.step()
    engine.start_recording(limit=10_000)
    engine.add_request("late", "The quick brown fox jumps over the lazy dog", params)
    expected = {}
    while engine.has_unfinished_requests():
        engine.step()
        expected[engine.events.step] = pool_state(engine)
    recording = engine.stop_recording().to_dict()
    assert recording["initial"]["tables"] and not recording["truncated"]
    replayed = replay_steps(16, [event_from_dict(e) for e in recording["events"]], recording["initial"])
    for step, (refs, _hashed, tables) in expected.items():
        assert replayed[step].ref_counts == refs and replayed[step].tables == tables, f"step {step}"
    assert engine.events.recording is None and not engine.events.enabled


def test_a_full_recording_stops_and_says_so():
    log = EventLog()
    log.start_recording(Recording(4, 4, {}, limit=2))
    for block in range(3):
        log.emit(BlockCached, block_id=block, block_hash="h")
    recording = log.stop_recording()
    assert [e.block_id for e in recording.events] == [0, 1] and recording.truncated
