"""A feed's subscription outlives its channel layer failing: the page hears an error frame instead of a
1011 close, and once the layer is back the feed joins its groups again, asks for fresh snapshots and relays."""
import asyncio

from channels.layers import InMemoryChannelLayer

from playground.dashboard import subscription
from playground.dashboard.subscription import BACK_FRAME, LOST_FRAME, Subscription


class FlakyLayer(InMemoryChannelLayer):
    """An in-memory layer that can be switched off: every call raises, as a dead Redis does."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("layer down")

    async def new_channel(self, prefix="specific."):
        self._check()
        return await super().new_channel(prefix)

    async def group_add(self, group, channel):
        self._check()
        await super().group_add(group, channel)

    async def receive(self, channel):
        while True:
            self._check()
            try:
                return await asyncio.wait_for(super().receive(channel), 0.05)
            except TimeoutError:
                continue


class Page:
    """The consumer side: a handler for `kv.snapshot` (which may be told to fail) and the frames sent."""

    def __init__(self, failing: int | None = None) -> None:
        self.relayed: list[int] = []
        self.frames: list[dict] = []
        self.failing = failing

    async def kv_snapshot(self, message: dict) -> None:
        if message["n"] == self.failing:
            raise KeyError("bug")
        self.relayed.append(message["n"])

    async def send_json(self, frame: dict) -> None:
        self.frames.append(frame)


def test_a_lost_layer_is_a_frame_and_the_feed_comes_back(monkeypatch):
    async def scenario():
        layer = FlakyLayer()
        monkeypatch.setattr(subscription, "get_channel_layer", lambda: layer)
        monkeypatch.setattr(subscription, "RETRY_S", 0.05)
        page, joins = Page(), []

        async def relaying(_layer):
            joins.append(feed._channel)

        feed = Subscription(("kv",), page, on_relay=relaying)
        await feed.start()
        feed.relay()
        await asyncio.sleep(0.1)
        await layer.group_send("kv", {"type": "kv.snapshot", "n": 1})
        await asyncio.sleep(0.1)
        layer.down = True
        await asyncio.sleep(0.3)  # several failed retries: one frame only
        assert page.frames == [LOST_FRAME]
        layer.down = False
        await asyncio.sleep(0.2)
        await layer.group_send("kv", {"type": "kv.snapshot", "n": 2})
        await asyncio.sleep(0.1)
        await feed.close()
        return page, joins

    page, joins = asyncio.run(scenario())
    assert page.relayed == [1, 2]
    assert page.frames == [LOST_FRAME, BACK_FRAME]
    assert len(joins) == 2  # joined, and joined again after the loss (the workers asked for snapshots twice)


def test_a_failing_handler_does_not_stop_the_feed(monkeypatch):
    async def scenario():
        layer = FlakyLayer()
        monkeypatch.setattr(subscription, "get_channel_layer", lambda: layer)
        page = Page(failing=1)
        feed = Subscription(("kv",), page)
        await feed.start()
        feed.relay()
        for n in (1, 2):
            await layer.group_send("kv", {"type": "kv.snapshot", "n": n})
        await asyncio.sleep(0.1)
        await feed.close()
        return page

    page = asyncio.run(scenario())
    assert (page.relayed, page.frames) == ([2], [])
