"""The web-side request lifecycle under faults, over the chat socket with the real worker runtime and a
scripted engine (fake_worker.py): whatever fails after admission, the client hears an end (its reply or an
error frame with its request_id) within seconds, the concurrency slot is given back, and the socket serves
the next request. Also: the Collector merges text for a lagging reader, and anonymous limits hold."""
import asyncio
import time

import pytest
from channels.layers import get_channel_layer
from django.core.cache import cache
from fake_worker import connect, generate, until_end, worker

from playground.accounts import limits
from playground.serving.shared import registry
from playground.serving.web import dispatch, lifecycle
from playground.serving.web.lifecycle import Collector, Generation

pytestmark = pytest.mark.django_db(transaction=True)
SLOT = f"limits:conc:{limits.anonymous_identity('')}"  # WebsocketCommunicator gives no client address
LONG = [{"role": "user", "content": "z" * 400}]


def slots_taken() -> int:
    return cache.get(SLOT) or 0


async def streaming(count: int) -> list:
    """`count` sockets, each with a long generation past its first token."""
    sockets = [await connect() for _ in range(count)]
    for ws in sockets:
        await ws.send_json_to(generate(LONG, max_tokens=300))
        assert (await ws.receive_json_from(timeout=5))["type"] == "started"
    for ws in sockets:
        assert (await ws.receive_json_from(timeout=5))["type"] == "token"
    return sockets


async def engine_idle(engine, timeout: float = 3) -> None:
    """Until the fake engine runs nothing (aborts land a moment after the client hears the end)."""
    deadline = time.monotonic() + timeout
    while engine.live and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def errors_of(sockets, timeout: float) -> list[dict]:
    return [(await until_end(ws, timeout))[-1] for ws in sockets]


def test_collector_merges_text_while_the_reader_lags_drops_repeats_and_wakes_it_at_once():
    async def scenario():
        collector = Collector()
        for seq, text in enumerate("abc"):
            collector.put({"type": "gen.tokens", "chunks": [{"index": 0, "seq": seq, "text": text}]})
        collector.put({"type": "gen.tokens", "chunks": [{"index": 0, "seq": 2, "text": "c"}]})  # a retried send, again
        collector.put({"type": "gen.tokens", "chunks": [{"index": 1, "seq": 3, "text": "x"}]})
        merged = await collector.take(1)
        waiter = asyncio.create_task(collector.take(5))
        await asyncio.sleep(0.05)
        woken_at = time.monotonic()
        collector.put({"type": "gen.done", "usage": {}})
        last = await waiter
        return merged, last, time.monotonic() - woken_at, await collector.take(0.01)

    merged, last, latency, nothing_new = asyncio.run(scenario())
    assert merged.chunks == [{"index": 0, "seq": 0, "text": "abc"}, {"index": 1, "seq": 1, "text": "x"}]
    assert last.chunks == [] and last.done == {"type": "gen.done", "usage": {}}
    assert latency < 0.05 and nothing_new is None


@pytest.mark.parametrize("failures", [1, 2])
def test_the_inbox_receive_failing_is_retried_once_then_an_error_that_gives_the_slot_back(monkeypatch, failures):
    """After a Redis restart the first call on a pooled connection fails: one failure is retried and the reply
    arrives whole; a second is an error frame, the slot comes back and the next request is served."""

    async def scenario():
        async with worker(monkeypatch):
            layer = get_channel_layer()
            real_receive = layer.receive
            calls = []

            async def receive(channel):
                calls.append(channel)
                if len(calls) <= failures:  # Redis is still restarting
                    raise ConnectionError("Redis restarted")
                return await real_receive(channel)

            monkeypatch.setattr(layer, "receive", receive)
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=3))
            first = await until_end(ws)
            taken_after_first = slots_taken()
            await ws.send_json_to(generate(max_tokens=3))
            after = await until_end(ws)
            await ws.disconnect()
            return first, taken_after_first, after

    first, taken_after_first, after = asyncio.run(scenario())
    if failures == 1:
        assert first[-1]["type"] == "done" and "".join(f.get("text", "") for f in first if f["type"] == "token")
    else:
        assert first[-1]["type"] == "error" and first[-1]["request_id"] == first[0]["request_id"]
        assert "channel layer" in first[-1]["message"]
    assert taken_after_first == 0 and slots_taken() == 0
    assert after[-1]["type"] == "done"


def test_the_channel_layer_failing_mid_stream_is_an_error_frame_not_a_closed_socket(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.02) as (engine, _):
            layer = get_channel_layer()
            real_receive = layer.receive
            broken = asyncio.Event()

            async def receive(channel):
                if broken.is_set():
                    raise ConnectionError("Redis went away")
                return await real_receive(channel)

            monkeypatch.setattr(layer, "receive", receive)
            sockets = await streaming(3)
            started_at = time.monotonic()
            broken.set()
            await layer.send(lifecycle.inbox.current().channel, {"type": "test.wake"})  # wake the parked receiver
            ends = await errors_of(sockets, timeout=10)
            waited = time.monotonic() - started_at
            broken.clear()  # the layer is back
            await sockets[0].send_json_to(generate(max_tokens=3))
            after = await until_end(sockets[0])
            for ws in sockets:
                await ws.disconnect()
            await engine_idle(engine)
            return ends, waited, after, engine

    ends, waited, after, engine = asyncio.run(scenario())
    assert [e["type"] for e in ends] == ["error"] * 3 and waited < 10
    assert all("channel layer" in e["message"] for e in ends)
    assert after[-1]["type"] == "done" and slots_taken() == 0
    assert not engine.live  # the failed requests were aborted in the engine


def test_a_lost_done_is_detected_and_answered_with_an_error(monkeypatch, settings):
    settings.PLAYGROUND_LOST_REPLY_GRACE = 1.0

    async def scenario():
        async with worker(monkeypatch):
            layer = get_channel_layer()
            real_send = layer.send

            async def lossy_send(channel, message):
                # The channel layer drops the message that carries the reply.
                if not any(event.get("type") == "gen.done" for event in lifecycle.inbox.events_of(message)):
                    await real_send(channel, message)

            monkeypatch.setattr(layer, "send", lossy_send)
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=5))
            started = await ws.receive_json_from(timeout=5)
            t0 = time.monotonic()
            end = (await until_end(ws, timeout=10))[-1]
            waited = time.monotonic() - t0
            await ws.disconnect()
            return started, end, waited

    started, end, waited = asyncio.run(scenario())
    assert end == {"type": "error", "request_id": started["request_id"],
                   "message": "the reply was lost: the GPU worker fake@test is no longer serving this request"}
    assert waited < 5 and slots_taken() == 0


def test_an_accepted_request_gets_an_error_at_its_deadline(monkeypatch, settings):
    settings.PLAYGROUND_REQUEST_DEADLINE_S = 2

    async def scenario():
        async with worker(monkeypatch, delay=0.05) as (engine, _):
            ws = await connect()
            await ws.send_json_to(generate(LONG, max_tokens=400))
            started = await ws.receive_json_from(timeout=5)
            t0 = time.monotonic()
            end = (await until_end(ws, timeout=10))[-1]
            waited = time.monotonic() - t0
            await ws.disconnect()
            await engine_idle(engine)
            return started, end, waited, engine

    started, end, waited, engine = asyncio.run(scenario())
    assert end["type"] == "error" and end["request_id"] == started["request_id"]
    assert end["message"] == "the request did not finish within 2 s"
    assert 1.5 < waited < 5 and slots_taken() == 0 and not engine.live


def test_the_engine_loop_failing_ends_every_stream_with_an_error_and_marks_the_worker_failed(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.02) as (engine, _):
            sockets = await streaming(4)
            t0 = time.monotonic()
            engine.fail_loop("RuntimeError: boom outside step()")
            ends = await errors_of(sockets, timeout=10)
            waited = time.monotonic() - t0
            await asyncio.sleep(1.5)  # a heartbeat
            heartbeat = await registry.aget("fake@test")
            await sockets[0].send_json_to(generate(max_tokens=3))
            refused = await until_end(sockets[0], timeout=5)
            for ws in sockets:
                await ws.disconnect()
            return ends, waited, heartbeat, refused

    ends, waited, heartbeat, refused = asyncio.run(scenario())
    assert [e["type"] for e in ends] == ["error"] * 4 and waited < 10
    assert all("generation failed" in e["message"] for e in ends)
    assert heartbeat["state"] == "failed" and heartbeat["health"]["alive"] is False
    assert heartbeat["health"]["error"] == "RuntimeError: boom outside step()" and heartbeat["requests"] == []
    assert refused[-1]["type"] == "error" and "engine loop failed" in refused[-1]["message"]
    assert slots_taken() == 0


def test_twenty_cookieless_sockets_get_at_most_the_per_address_limit(monkeypatch, settings):
    """Each cookie-less socket is a new session: per-session limits let all 20 in where the limit is 16."""
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {"max_concurrent_requests_per_address": 16,
                                            "tokens_per_minute_per_address": 0, "max_concurrent_requests": 64}

    async def scenario():
        async with worker(monkeypatch, delay=0.05):
            sockets = [await connect() for _ in range(20)]
            for ws in sockets:
                await ws.send_json_to(generate(LONG, max_tokens=300))
            answers = [await ws.receive_json_from(timeout=5) for ws in sockets]
            for ws in sockets:
                await ws.disconnect()
            return answers

    answers = asyncio.run(scenario())
    assert [a["type"] for a in answers].count("started") == 16
    refused = [a for a in answers if a["type"] == "error"]
    assert len(refused) == 4 and all("at most 16 at once" in a["message"] for a in refused)
    assert slots_taken() == 0


def test_the_anonymous_pool_caps_every_address_together():
    pool = 3
    quota = limits.Quota(max_concurrent_requests=2, tokens_per_minute=0)
    held = [limits.admit(limits.anonymous_identity(f"10.0.0.{i}"), quota, pool) for i in range(pool)]
    with pytest.raises(limits.LimitExceeded, match="too many anonymous requests on this server"):
        limits.admit(limits.anonymous_identity("10.0.0.9"), quota, pool)
    assert cache.get(f"limits:conc:{limits.anonymous_identity('10.0.0.9')}") == 0  # its own slot was given back
    for admission in held:
        admission.release()
    assert cache.get(limits.ANONYMOUS_POOL_KEY) == 0


class RecordingSlot:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1

    def record(self, tokens: int) -> None:
        pass


async def started_generation(slot: RecordingSlot) -> Generation:
    """A Generation as if started and not finished (it listens on its inbox), without a worker."""
    generation = Generation(slot)
    generation._inbox = lifecycle.inbox.current()
    await generation._inbox.open(generation.request_id, generation.collector)
    return generation


def test_close_finishes_releasing_when_its_caller_is_cancelled_midway(monkeypatch):
    """A socket closing just as its request ends cancels the relay task inside close(): the slot leaked."""

    async def slow_abort(request_id: str) -> None:
        await asyncio.sleep(0.2)

    monkeypatch.setattr(dispatch, "abort", slow_abort)
    slot = RecordingSlot()

    async def scenario():
        closing = asyncio.create_task((await started_generation(slot)).close())
        await asyncio.sleep(0.05)  # inside the abort
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        await asyncio.sleep(0.4)

    asyncio.run(scenario())
    assert slot.released == 1


def test_an_abort_the_channel_layer_refused_is_sent_again_in_the_background(monkeypatch):
    """Redis down when the client went: the abort was lost and the worker generated for nobody."""
    sent = []

    async def flaky_abort(request_id: str) -> None:
        sent.append(request_id)
        if len(sent) == 1:
            raise ConnectionError("Redis is restarting")

    monkeypatch.setattr(dispatch, "abort", flaky_abort)
    monkeypatch.setattr(lifecycle, "ABORT_RETRY_EVERY_S", 0.05)
    monkeypatch.setattr(lifecycle, "ABORT_RETRY_S", 0.3)
    slot = RecordingSlot()

    async def scenario():
        generation = await started_generation(slot)
        await generation.close()
        released_at_close = slot.released
        await asyncio.sleep(0.5)
        return generation.request_id, released_at_close

    request_id, released_at_close = asyncio.run(scenario())
    assert released_at_close == 1  # the slot does not wait for the channel layer
    assert len(sent) >= 4 and set(sent) == {request_id}  # sent again after it first succeeded, until given up
