"""The KV dashboard without a model: snapshot schema and encoding, tokens/s and latency figures, the
worker's publishing rules, and who may open the memory view and the snapshot feeds (HTTP and websocket)."""
import asyncio
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from playground.asgi import application
from playground.dashboard.consumers import CLOSE_FORBIDDEN, CLOSE_LOGIN_REQUIRED
from playground.serving.shared import kv_feed
from playground.serving.worker import kv_snapshot
from playground.serving.worker.kv_publisher import SnapshotPublisher
from playground.serving.worker.stats import LatencyStats, ThroughputMeter, percentiles
from playground.serving.shared import registry
from playground.serving.shared.naming import CONTROL_GROUP

ORIGIN = (b"origin", b"http://127.0.0.1")
BLOCK_SIZE = 16


def block(state: str, ref_count: int = 0, owners=()) -> dict:
    return {"state": state, "ref_count": ref_count, "owners": list(owners)}


# Request "a" (n=2) shares blocks 0 and 1 (its prompt) between its samples; block 3 is cached, 4 free.
BLOCK_MAP = [block("used", 2, ["a"]), block("used", 2, ["a"]), block("used", 1, ["a"]), block("cached"),
             block("free"), block("used", 1, ["a"])]
SEQUENCES = [
    {"request_id": "a", "index": 0, "block_table": [0, 1, 2], "context_len": 40, "max_len": 135},
    {"request_id": "a", "index": 1, "block_table": [0, 1, 5], "context_len": 40, "max_len": 135},
]
METRICS = {"block_size": BLOCK_SIZE, "num_blocks_total": 6, "num_blocks_used": 4, "kv_cache_usage": 4 / 6,
           "generation_tokens_total": 10, "block_map": BLOCK_MAP, "sequences": SEQUENCES}


def test_snapshot_has_the_documented_shape_and_a_compact_block_map():
    counters, memory = kv_snapshot.KvSampler().sample(METRICS)
    summary = kv_snapshot.build_summary("w1", counters, 12.345, {"requests": 0}, 1000.0)
    expected_summary = {
        "type": "snapshot",
        "worker": "w1",
        "time": 1000.0,
        "stamps": {"counters": 1},
        "metrics": {k: v for k, v in METRICS.items() if k not in ("block_map", "sequences")},
        "tokens_per_s": 12.35,
        "latency": {"requests": 0},
    }
    assert summary == expected_summary
    snap = kv_snapshot.with_block_map(summary, memory)
    assert snap == {
        **expected_summary,
        "stamps": {"counters": 1, "block_map": 1},
        "block_map": {
            "states": "ssucfu",
            "ref_counts": {"0": 2, "1": 2},  # only where the state does not imply the count
            "owners": {"0": ["a"], "1": ["a"], "2": ["a"], "5": ["a"]},
        },
        "requests": [
            {"request_id": "a", "index": 0, "block_table": [0, 1, 2], "context_len": 40, "max_len": 135},
            {"request_id": "a", "index": 1, "block_table": [0, 1, 5], "context_len": 40, "max_len": 135},
        ],
    }


def test_block_map_with_an_unknown_state_is_refused():
    with pytest.raises(ValueError, match="block 0 has unknown state 'swapped'"):
        kv_snapshot.encode_block_map([block("swapped")])


def test_a_large_pool_encodes_to_a_small_message():
    """100k blocks, 64 requests of 32 blocks each: well under a megabyte, most of it the state string."""
    import json

    pool = [block("free") for _ in range(100_000)]
    for r in range(64):
        for b in range(32):
            pool[r * 32 + b] = block("used", 1, [f"{r:032x}"])
    size = len(json.dumps(kv_snapshot.encode_block_map(pool)))
    assert size < 100_000 + 64 * 32 * 50


def test_throughput_meter_reports_the_recent_rate_and_falls_to_zero_when_idle():
    meter = ThroughputMeter(window_s=2.0)
    assert meter.sample(0.0, 0) == 0.0
    assert meter.sample(1.0, 50) == 50.0
    assert meter.sample(2.0, 100) == 50.0
    assert meter.sample(3.0, 300) == pytest.approx(125.0)  # the window: samples since t=1
    meter.sample(4.0, 300)
    assert meter.sample(5.0, 300) == 0.0
    assert meter.sample(6.0, 10) == 0.0  # a new engine restarted the counter


def test_latency_stats_percentiles_and_histograms():
    stats = LatencyStats()
    for i in range(10):
        arrival = 100.0 * i
        tokens = [arrival + 0.1 * (i + 1) + 0.02 * k for k in range(5)]  # TTFT 0.1·(i+1) s, 20 ms gaps
        stats.observe(SimpleNamespace(arrival_time=arrival, first_token_time=tokens[0], finished_time=tokens[-1],
                                      first_scheduled_time=arrival, last_token_time=tokens[-1],
                                      token_times=tokens))
    summary = stats.summary()
    assert summary["requests"] == 10
    assert summary["ttft_ms"] == {"p50": 500.0, "p90": 900.0, "p99": 1000.0}
    assert summary["itl_ms"] == {"p50": 20.0, "p90": 20.0, "p99": 20.0}
    exported = stats.export()
    assert exported["ttft"]["count"] == 10 and exported["ttft"]["sum"] == pytest.approx(5.5)
    assert exported["itl"]["count"] == 40 and exported["tpot"]["count"] == 10 and exported["e2e"]["count"] == 10
    bounds = exported["ttft"]["bounds"]
    # 0.1 s lands in the bucket whose upper bound is 0.1; 0.2 .. 0.5 in (0.1, 0.25] and (0.25, 0.5].
    assert exported["ttft"]["counts"][bounds.index(0.1)] == 1
    assert exported["ttft"]["counts"][bounds.index(0.25)] == 1
    assert exported["ttft"]["counts"][bounds.index(0.5)] == 3
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


class ScriptedService:
    """What SnapshotPublisher reads of EngineService, with figures the test sets."""

    def __init__(self) -> None:
        self.figures: dict = {}
        self.resets = 0

    def metrics(self, block_map: bool = False) -> dict:
        return self.figures

    def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_publisher_speaks_while_figures_change_then_falls_quiet():
    service = ScriptedService()
    publisher = SnapshotPublisher("w1", service, bridge=None, interval_s=0.25)
    assert publisher.poll(0.0) is None  # loading: no block map yet
    service.figures = METRICS
    assert publisher.poll(1.0).summary["metrics"]["generation_tokens_total"] == 10
    assert publisher.poll(1.25) is not None  # unchanged, but lingering so tokens/s can be seen falling
    assert publisher.poll(1.0 + publisher.linger_s + 0.01) is None  # idle: quiet
    service.figures = {**METRICS, "generation_tokens_total": 20}  # a new dict, equal or not, is checked
    assert publisher.poll(10.0) is not None
    service.figures = dict(service.figures)  # equal content: no change
    assert publisher.poll(10.0 + publisher.linger_s + 0.01) is None


def test_publisher_answers_refresh_and_resets_only_its_own_prefix_cache():
    service = ScriptedService()
    service.figures = METRICS
    publisher = SnapshotPublisher("w1", service, bridge=None, interval_s=0.25)
    publisher.poll(0.0)
    assert publisher.poll(100.0) is None
    publisher.control({"type": kv_feed.REFRESH})
    assert publisher.poll(100.25) is not None
    assert publisher.poll(100.5) is None
    publisher.control({"type": kv_feed.RESET_PREFIX_CACHE, "worker": "w2"})
    assert service.resets == 0 and publisher.poll(101.0) is None
    publisher.control({"type": kv_feed.RESET_PREFIX_CACHE, "worker": "w1"})
    assert service.resets == 1 and publisher.poll(101.25) is not None  # the new state is shown at once


def test_publisher_builds_full_snapshots_only_while_a_memory_view_holds_a_lease():
    service = ScriptedService()
    service.figures = METRICS
    publisher = SnapshotPublisher("w1", service, bridge=None, interval_s=0.25)
    assert publisher.poll(0.0).full is None  # only chat pages may be watching: figures only
    publisher.control({"type": kv_feed.REFRESH, "watch": True})  # a memory view connects
    first = publisher.poll(0.25)
    assert first.full["block_map"]["states"] == "ssucfu" and first.full["requests"][0]["block_table"] == [0, 1, 2]
    assert {k: v for k, v in first.full.items() if k in first.summary and k != "stamps"} == {
        k: v for k, v in first.summary.items() if k != "stamps"}
    publisher.control({"type": kv_feed.WATCH})  # renewed while open
    publisher.control({"type": kv_feed.REFRESH})
    assert publisher.poll(20.0).full is not None
    publisher.control({"type": kv_feed.REFRESH})
    assert publisher.poll(20.0 + kv_feed.WATCH_LEASE_S + 0.01).full is None  # closed: no renewal, lease over


def test_between_block_map_refreshes_full_snapshots_keep_the_map_with_its_own_tables():
    """StreamingEngine refreshes its counters every step and the map every ~100 ms, carrying the old map
    over without `sequences`: the full snapshot failed with a KeyError, logged and dropped."""
    service = ScriptedService()
    publisher = SnapshotPublisher("w1", service, bridge=None, interval_s=0.25)
    publisher.control({"type": kv_feed.REFRESH, "watch": True})
    service.figures = METRICS  # a block-map refresh: map and tables of one step
    fresh = publisher.poll(0.0).full
    carried = {k: v for k, v in METRICS.items() if k != "sequences"} | {"generation_tokens_total": 11}
    service.figures = carried  # the next step: new counters, the old map object, no tables
    between = publisher.poll(0.25).full
    assert between["stamps"] == {"counters": 2, "block_map": 1}
    assert between["metrics"]["generation_tokens_total"] == 11
    assert between["block_map"] == fresh["block_map"] and between["requests"] == fresh["requests"] == SEQUENCES
    moved = [block("used", 1, ["b"])] + BLOCK_MAP[1:]
    service.figures = {**carried, "block_map": moved, "generation_tokens_total": 12}  # a map seen without tables
    still = publisher.poll(0.5).full
    assert still["stamps"] == {"counters": 3, "block_map": 1} and still["requests"] == SEQUENCES
    assert still["block_map"] == fresh["block_map"]  # never a map with another step's tables
    service.figures = {**METRICS, "block_map": moved, "sequences": SEQUENCES[:1], "generation_tokens_total": 13}
    assert publisher.poll(0.75).full["stamps"] == {"counters": 4, "block_map": 4}


# --- access: HTTP ---------------------------------------------------------------------------------------
@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("ada", password="x" * 12, is_staff=True)


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("bob", password="x" * 12)


@pytest.mark.django_db
def test_memory_view_is_staff_only(client, staff, member):
    response = client.get("/memory/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/memory/"
    client.force_login(member)
    response = client.get("/memory/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    client.force_login(staff)
    response = client.get("/memory/")
    assert response.status_code == 200
    assert b'id="worker-card"' in response.content and b"memory/main.js" in response.content


# --- access and actions: websockets --------------------------------------------------------------------
async def ws_connect(path: str, user=None) -> tuple[WebsocketCommunicator, bool, int | None]:
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN])
    if user is not None:
        communicator.scope["user"] = user  # what the auth middleware would set; it keeps a user already set
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


def run(coro):
    return asyncio.run(coro)


@pytest.mark.django_db(transaction=True)
def test_memory_socket_refuses_everyone_but_staff(staff, member):
    async def scenario():
        for user in (None, member):
            _, connected, code = await ws_connect("/ws/memory/", user)
            assert not connected and code == CLOSE_FORBIDDEN
        ws, connected, _ = await ws_connect("/ws/memory/", staff)
        assert connected
        await ws.disconnect()

    run(scenario())


@pytest.mark.django_db(transaction=True)
def test_memory_socket_relays_snapshots_asks_workers_for_one_and_renews_its_lease(staff, monkeypatch):
    monkeypatch.setattr(kv_feed, "WATCH_RENEW_S", 0.1)

    async def scenario():
        layer = get_channel_layer()
        control = await layer.new_channel("test.control.")
        await layer.group_add(CONTROL_GROUP, control)
        ws, connected, _ = await ws_connect("/ws/memory/", staff)
        assert connected
        assert await asyncio.wait_for(layer.receive(control), 5) == {"type": kv_feed.REFRESH, "watch": True}
        counters, memory = kv_snapshot.KvSampler().sample(METRICS)
        full = kv_snapshot.with_block_map(kv_snapshot.build_summary("w1", counters, 1.0, {}, 1.0), memory)
        await layer.group_send(kv_feed.KV_GROUP, {"type": kv_feed.SNAPSHOT, "snapshot": full})
        assert await ws.receive_json_from(timeout=5) == full
        assert await asyncio.wait_for(layer.receive(control), 5) == {"type": kv_feed.WATCH}
        await ws.disconnect()

    run(scenario())


@pytest.mark.django_db(transaction=True)
def test_memory_socket_actions_reach_the_workers(staff):
    async def scenario():
        layer = get_channel_layer()
        control = await layer.new_channel("test.control.")
        await layer.group_add(CONTROL_GROUP, control)
        ws, _, _ = await ws_connect("/ws/memory/", staff)
        await layer.receive(control)  # the refresh request

        await ws.send_json_to({"type": "abort", "worker": "w1", "request_id": "r1"})
        assert (await ws.receive_json_from(timeout=5))["type"] == "ack"
        assert await asyncio.wait_for(layer.receive(control), 5) == {"type": "gen.abort", "request_id": "r1"}

        await ws.send_json_to({"type": "reset_prefix_cache", "worker": "w1"})
        assert await ws.receive_json_from(timeout=5) == {"type": "error", "message": "worker w1 is not alive"}
        await asyncio.to_thread(registry.beat, {"name": "w1", "state": "ready", "metrics": {}})
        await ws.send_json_to({"type": "reset_prefix_cache", "worker": "w1"})
        assert (await ws.receive_json_from(timeout=5))["type"] == "ack"
        assert await asyncio.wait_for(layer.receive(control), 5) == {"type": kv_feed.RESET_PREFIX_CACHE, "worker": "w1"}
        await ws.send_json_to({"type": "record", "worker": "w1", "action": "start"})
        assert (await ws.receive_json_from(timeout=5))["type"] == "ack"
        assert await asyncio.wait_for(layer.receive(control), 5) == {"type": kv_feed.RECORD, "worker": "w1",
                                                                     "action": "start"}

        for bad, message in [
            ({"type": "record", "worker": "w1", "action": "rewind"}, "action must be 'start' or 'stop'"),
            ({"type": "abort", "worker": "w1"}, "request_id must be a non-empty string"),
            ({"type": "explode", "worker": "w1"}, "type must be 'abort', 'reset_prefix_cache' or 'record'"),
            ([1, 2], "frame must be a JSON object"),
        ]:
            await ws.send_json_to(bad)
            assert await ws.receive_json_from(timeout=5) == {"type": "error", "message": message}
        await ws.send_to(text_data="{not json")
        assert (await ws.receive_json_from(timeout=5))["type"] == "error"
        await ws.disconnect()

    run(scenario())


@pytest.mark.django_db(transaction=True)
def test_kv_feed_sends_summaries_to_whoever_may_chat(member):
    async def scenario():
        with override_settings(PLAYGROUND_ALLOW_ANONYMOUS=False):
            _, connected, code = await ws_connect("/ws/kv/")
            assert not connected and code == CLOSE_LOGIN_REQUIRED
            ws, connected, _ = await ws_connect("/ws/kv/", member)
            assert connected
        summary = kv_snapshot.build_summary("w1", kv_snapshot.KvSampler().sample(METRICS)[0], 1.0, {}, 1.0)
        await get_channel_layer().group_send(kv_feed.SUMMARY_GROUP, {"type": kv_feed.SNAPSHOT, "snapshot": summary})
        assert await ws.receive_json_from(timeout=5) == summary
        await ws.send_json_to({"type": "abort", "worker": "w1", "request_id": "r1"})
        assert await ws.receive_json_from(timeout=5) == {"type": "error", "message": "this feed is read-only"}
        await ws.disconnect()

    run(scenario())
