"""The published KV snapshot and `/metrics` against the real engine's own state (the real model on the CPU).

The test steps an `LLMEngine` itself, so the engine holds still while each snapshot is compared; everything
else is the worker's real path: EngineService, the worker runtime's publisher, the channel layer, the
heartbeat and the `/metrics` view. The script covers every block state: a request with n=2 (its samples
share the prompt's blocks), its prompt cached once it finished, the same prompt again (a prefix-cache hit),
and a reset of the prefix cache through the control-group message the memory view's button sends.
"""
import math

import pytest
from channels.layers import get_channel_layer
from prometheus_client.parser import text_string_to_metric_families

from inference import EngineArgs, EngineHealth, LLMEngine, SamplingParams
from playground.serving.shared import kv_feed
from playground.serving.shared import registry
from playground.serving.worker.bridge import LoopBridge
from playground.serving.worker.engine_service import EngineService
from playground.serving.worker.runtime import WorkerRuntime

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
PROMPT = {"prompt_token_ids": list(range(1000, 1050))}  # 50 tokens: three full blocks and a partial one


class SteppedEngine:
    """An LLMEngine that the test steps, in the shape EngineService drives a StreamingEngine."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.args = engine.args

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def metrics(self) -> dict:
        return self.engine.metrics()

    def health(self) -> EngineHealth:
        return EngineHealth(alive=True, error=None, last_step_at=None)

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineArgs(model="smollm2-135m-instruct", device="cpu", block_size=BLOCK_SIZE, num_kv_blocks=24,
                                max_model_len=256, max_num_seqs=8, seed=0))


@pytest.fixture
def worker(engine):
    """A worker runtime around the stepped engine (its threads not started: the test drives the publisher),
    plus a channel in the memory view's group: `publish()` returns the snapshot that arrived there."""
    service = EngineService({}, engine_factory=lambda **kwargs: SteppedEngine(engine))
    service.load()
    bridge = LoopBridge()
    bridge.start()
    runtime = WorkerRuntime("stepped@test", service, bridge)
    layer = get_channel_layer()
    channel = bridge.call(layer.new_channel("test.kv."))
    bridge.call(layer.group_add(kv_feed.KV_GROUP, channel))
    clock = iter(range(10**6))

    def publish() -> dict:
        # As the memory view asks: publish now, even if the figures did not change, with the block map.
        runtime.publisher.control({"type": kv_feed.REFRESH, "watch": True})
        runtime.publisher.publish(runtime.publisher.poll(float(next(clock))))
        message = bridge.call(layer.receive(channel), 5)
        assert message["type"] == kv_feed.SNAPSHOT
        return message["snapshot"]

    yield runtime, publish
    bridge.stop()


def decode(block_map: dict) -> list[tuple[str, int, list[str]]]:
    """The compact block map as (state letter, ref count, owners) per block, as static/common/snapshot.js reads it."""
    implied = {"f": 0, "u": 1, "c": 0}
    return [
        (state, block_map["ref_counts"].get(str(i), implied.get(state)), block_map["owners"].get(str(i), []))
        for i, state in enumerate(block_map["states"])
    ]


def engine_state(engine: LLMEngine) -> list[tuple[str, int, list[str]]]:
    """The same view read from the engine's own pool and its running sequences' block tables."""
    holders: dict[int, list[str]] = {}
    for seq in engine.live_sequences():
        for block_id in seq.block_table:
            ids = holders.setdefault(block_id, [])
            if seq.request_id not in ids:
                ids.append(seq.request_id)
    view = []
    for block in engine.block_manager.pool.blocks:
        if block.ref_count:
            state = "s" if block.ref_count > 1 else "u"
        else:
            state = "c" if block.block_hash is not None else "f"
        view.append((state, block.ref_count, holders.get(block.block_id, [])))
    return view


def check(snapshot: dict, engine: LLMEngine) -> set[str]:
    """Assert the published snapshot is the engine's state; returns the block states it shows."""
    engine.check_integrity()
    assert decode(snapshot["block_map"]) == engine_state(engine)
    tables = {(s.request_id, s.index): s for s in engine.live_sequences()}
    assert {(r["request_id"], r["index"]) for r in snapshot["requests"]} == set(tables)
    for entry in snapshot["requests"]:
        seq = tables[(entry["request_id"], entry["index"])]
        assert entry["block_table"] == seq.block_table
        assert entry["context_len"] == seq.num_computed_tokens
        assert len(entry["block_table"]) == math.ceil(entry["context_len"] / BLOCK_SIZE)
    # The contiguous counterfactual: every live sequence reserving its prompt + max_tokens up front.
    reserve = {r.request_id: (len(r.seqs) if r.forked else r.params.n) * math.ceil(
        min(len(r.prompt_token_ids) + r.params.max_tokens, engine.max_model_len) / BLOCK_SIZE)
        for r in engine.requests.values()}
    assert snapshot["metrics"]["contiguous"]["prompt_plus_max_tokens"]["reserved_blocks"] == sum(reserve.values())
    figures = engine.metrics(block_map=False)
    assert snapshot["metrics"] == figures
    return set(snapshot["block_map"]["states"])


def run_to_end(engine: LLMEngine, runtime: WorkerRuntime) -> None:
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                runtime.publisher.observe(output.metrics)


@pytest.mark.django_db
def test_published_block_map_is_the_engines_state_through_sharing_caching_and_reset(engine, worker, client):
    runtime, publish = worker
    seen: set[str] = set()
    engine.add_request("shared", PROMPT, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=6))
    engine.step()  # prefill, then the request forks: both samples hold every prompt block
    first = publish()
    seen |= check(first, engine)
    assert first["block_map"]["states"].count("s") == 4
    assert first["metrics"]["num_requests_running"] == 1 and len(first["requests"]) == 2
    engine.step()  # each sample writes to its own copy of the partial block
    seen |= check(publish(), engine)
    run_to_end(engine, runtime)
    cached = publish()
    seen |= check(cached, engine)
    assert cached["block_map"]["states"].count("c") == 3 and cached["requests"] == []

    engine.add_request("again", PROMPT, SamplingParams(temperature=0, max_tokens=3))
    engine.step()  # the prompt's three full blocks come from the prefix cache
    seen |= check(publish(), engine)
    run_to_end(engine, runtime)
    runtime.publisher.control({"type": kv_feed.RESET_PREFIX_CACHE, "worker": runtime.name})
    reset = publish()
    seen |= check(reset, engine)
    assert set(reset["block_map"]["states"]) == {"f"}
    assert seen == {"f", "u", "s", "c"}
    assert reset["latency"]["requests"] == 2 and reset["latency"]["ttft_ms"]["p50"] > 0

    # /metrics renders this worker's heartbeat: the engine's figures under vLLM's names.
    beat = runtime.heartbeat()
    assert beat["max_model_len"] == 256  # the engine's resolved window, which the web side states
    assert beat["suggested_sampling"] == {}  # SmolLM2's generation_config.json suggests no sampling
    registry.beat(beat)
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {
        (s.name, s.labels.get("le")): s
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    figures = engine.metrics(block_map=False)
    for name, key in [
        ("vllm:num_requests_running", "num_requests_running"),
        ("vllm:kv_cache_usage_perc", "kv_cache_usage"),
        ("vllm:prompt_tokens_total", "prompt_tokens_total"),
        ("vllm:generation_tokens_total", "generation_tokens_total"),
        ("vllm:prefix_cache_queries_total", "prefix_cache_queries_total"),
        ("vllm:prefix_cache_hits_total", "prefix_cache_hits_total"),
        ("vllm:num_preemptions_total", "num_preemptions_total"),
        ("playground:num_blocks_total", "num_blocks_total"),
    ]:
        sample = samples[(name, None)]
        assert sample.value == pytest.approx(figures[key]), name
        assert sample.labels == {"worker": "stepped@test", "model_name": "smollm2-135m-instruct"}
    assert figures["prefix_cache_hits_total"] >= 3 * BLOCK_SIZE
    assert samples[("vllm:time_to_first_token_seconds_count", None)].value == 2
    assert samples[("vllm:e2e_request_latency_seconds_count", None)].value == 2
