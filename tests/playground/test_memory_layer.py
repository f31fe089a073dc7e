"""The embedded channel layer (playground/serving/shared/memory_layer.py): Channels' in-memory semantics, with
the expiry sweep at most once a second instead of on every message."""
import asyncio

import pytest
from channels.layers import InMemoryChannelLayer

from playground.serving.shared import memory_layer
from playground.serving.shared.memory_layer import EmbeddedChannelLayer


class Clock:
    """time.monotonic for the layer's sweep schedule, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(memory_layer.time, "monotonic", clock)
    return clock


@pytest.fixture
def sweeps(monkeypatch) -> list[int]:
    counted: list[int] = []
    sweep = InMemoryChannelLayer._clean_expired

    def counting(layer) -> None:
        counted.append(1)
        sweep(layer)

    monkeypatch.setattr(InMemoryChannelLayer, "_clean_expired", counting)
    return counted


def test_a_group_message_reaches_every_member_as_a_copy() -> None:
    async def run():
        layer = EmbeddedChannelLayer()
        await layer.group_add("req.1", "a")
        await layer.group_add("req.1", "b")
        await layer.group_add("req.2", "c")
        message = {"type": "gen.tokens", "chunks": [{"text": "Hi"}]}
        await layer.group_send("req.1", message)
        message["chunks"][0]["text"] = "changed after sending"
        received = [await layer.receive("a"), await layer.receive("b")]
        assert received == [{"type": "gen.tokens", "chunks": [{"text": "Hi"}]}] * 2
        assert "c" not in layer.channels  # nothing for the other group

    asyncio.run(run())


def test_the_sweep_runs_once_a_second_however_many_messages_pass(clock: Clock, sweeps: list[int]) -> None:
    async def run():
        layer = EmbeddedChannelLayer()
        await layer.group_add("req.1", "a")
        for _ in range(100):
            await layer.group_send("req.1", {"type": "gen.tokens"})
            await layer.receive("a")
        assert len(sweeps) == 1
        clock.now += memory_layer.SWEEP_EVERY_S
        await layer.group_send("req.1", {"type": "gen.tokens"})
        assert len(sweeps) == 2

    asyncio.run(run())


def test_an_expired_message_is_still_dropped_with_its_channel_s_memberships(clock: Clock) -> None:
    async def run():
        layer = EmbeddedChannelLayer(expiry=0)  # every message is expired at once
        await layer.group_add("req.1", "gone")
        await layer.group_send("req.1", {"type": "gen.tokens"})  # the sweep ran before this message
        assert layer.channels["gone"].qsize() == 1
        clock.now += memory_layer.SWEEP_EVERY_S
        await layer.group_send("req.2", {"type": "gen.tokens"})  # any message sweeps once the second is up
        assert "gone" not in layer.channels and "gone" not in layer.groups.get("req.1", {})

    asyncio.run(run())


def test_a_member_with_a_full_queue_misses_the_message_and_the_others_get_it() -> None:
    async def run():
        layer = EmbeddedChannelLayer(capacity=1)
        await layer.group_add("req.1", "full")
        await layer.group_add("req.1", "free")
        await layer.send("full", {"type": "first"})
        await layer.group_send("req.1", {"type": "second"})
        assert await layer.receive("free") == {"type": "second"}
        assert await layer.receive("full") == {"type": "first"}
        assert "full" not in layer.channels  # nothing else was queued for it

    asyncio.run(run())
