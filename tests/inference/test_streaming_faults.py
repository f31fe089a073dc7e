"""StreamingEngine when its loop thread fails: no stream waits forever, no block leaks, health() tells.

Each test kills its own engine, so each builds one (small KV pool).
"""

import time

import pytest

from inference import EngineDeadError, EngineHealth, SamplingParams, StreamingEngine

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
PROMPTS = ["Count to one hundred:", "Tell me a long story.", "List every colour you know.", "Hi"]


@pytest.fixture
def engine():
    engine = StreamingEngine(num_kv_blocks=64, max_model_len=256)
    engine.start()
    yield engine
    engine.shutdown()


def drain(stream, within_s: float = 10.0) -> list:
    """Every delta of a stream, failing the test if the stream has not ended within `within_s`."""
    deadline = time.monotonic() + within_s
    deltas = []
    while (delta := stream.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
        deltas.append(delta)
    return deltas


def assert_no_blocks_held(engine):
    engine.engine.check_integrity()
    assert not engine.engine.has_unfinished_requests()
    assert all(b.ref_count == 0 for b in engine.engine.block_manager.pool.blocks)


def test_health_while_serving(engine):
    health = engine.health()
    assert health == EngineHealth(alive=True, error=None, last_step_at=None)
    before = time.time()
    drain(engine.add_request("Hi", SamplingParams(temperature=0, max_tokens=4)), within_s=60)
    health = engine.health()
    assert health.alive and health.error is None and before <= health.last_step_at <= time.time()


def test_a_failure_outside_step_fails_every_stream_and_refuses_new_requests(engine, monkeypatch):
    streams = [engine.add_request(p, LONG) for p in PROMPTS]
    assert streams[0].get(timeout=60) is not None  # the loop is mid-generation

    def publish_fails(output, woken=None):
        raise RuntimeError("publisher broke")

    monkeypatch.setattr(engine, "_publish", publish_fails)
    for stream in streams:
        deltas = drain(stream)
        assert deltas[-1].finished and deltas[-1].finish_reason == "error"
        assert "publisher broke" in stream.error
    health = engine.health()
    assert not health.alive and health.error == "engine loop failed: RuntimeError: publisher broke"
    assert health.last_step_at is not None
    with pytest.raises(EngineDeadError, match="publisher broke"):
        engine.add_request("Hi", SamplingParams(max_tokens=4))
    assert_no_blocks_held(engine)


def test_a_failure_draining_commands_fails_queued_and_running_requests(engine, monkeypatch):
    running = engine.add_request(PROMPTS[0], LONG)
    assert running.get(timeout=60) is not None

    def add_fails(request):
        raise RuntimeError("queue broke")

    monkeypatch.setattr(engine.engine, "add", add_fails)
    queued = [engine.add_request(p, LONG) for p in PROMPTS[1:]]
    for stream in [running, *queued]:
        assert drain(stream)[-1].finish_reason == "error"
        assert "queue broke" in stream.error
    assert not engine.health().alive
    assert_no_blocks_held(engine)


def test_shutdown_ends_in_flight_streams(engine):
    stream = engine.add_request(PROMPTS[0], LONG)
    assert stream.get(timeout=60) is not None
    engine.shutdown()
    assert drain(stream)[-1].finish_reason == "error"
    assert stream.error == "the engine has shut down"
    assert engine.health() == EngineHealth(alive=False, error=None, last_step_at=engine.health().last_step_at)
    with pytest.raises(EngineDeadError, match="shut down"):
        engine.add_request("Hi", SamplingParams(max_tokens=4))
    assert_no_blocks_held(engine)
