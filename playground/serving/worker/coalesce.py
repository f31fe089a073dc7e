"""One publisher per worker: the text of every live request, coalesced into few channel-layer messages.

A fast engine emits a delta per sequence per step; sending each one would fill the channel's capacity, past
which Channels drops messages silently. And a thread per request blocking on its stream, hopping into the
event loop per message, costs the engine loop thread the GIL. So one coroutine on the worker's event loop
serves all requests: it drains every live stream without blocking and sends, per request, its first token at
once (with its text, or an empty text when it has none yet), then at most one `gen.tokens` event per `interval`
carrying everything that arrived meanwhile, per sample index, numbered by `seq`, with how many tokens that text
is and the request's prompt length (docs/protocol.md; the API's `continuous_usage_stats` counts with them). When
a stream ends its last text goes out at once, and only then does the request's future resolve: the task thread
waiting on it posts `gen.done` after that (below).

The events due at one wake-up travel as one `gen.batch` message per web process (the request's `reply_to`,
that process's inbox: serving/web/inbox.py), not one message per request: an engine step fills every
stream at once, and through Redis each message costs both processes a round trip and a wake-up. The task
threads' own events (`gen.accepted`, `gen.done`, `gen.error`) are posted to the publisher (`post`) and
ride in the same messages: a step that ends 64 requests used to send 64 `gen.done` messages, which the web
process, busy finishing each request, took one at a time, the last ~110 ms after the worker had sent it
(a distributed 64-chat run, `python -m bench.serving --stack distributed`). A task thread posts its
`gen.accepted` and submits its request at once: a burst's threads each waited for their own send before. And a
`gen.accepted` is held (`post(hold=True)`) for up to one `interval`, or until the publisher's next message to its
web process, which it then leads: a burst of 64 chats reaching the worker over ~0.2 s had sent 38-59 messages for
its 64 `gen.accepted` events (Redis round trips and wake-ups of both processes, while the engine's first steps
wanted the cores), each also waking its request's reader on the web side for no text; held, 4-7 (a distributed
64-chat run, 9 rounds each; the burst reached the engine over 179 ms against 200, median).

A paced request (the chat page's, `Job.paced`) waits longer between events while many stream: the worker's
paced events share `PLAYGROUND_WS_FRAMES_PER_S`, so its interval is the number of live requests over that budget
when that is longer (64 streams at 125 a second: 512 ms). Each event is a websocket frame on the web side,
0.15-0.3 ms of Channels, daphne and the socket's send on the event loop; on the embedded stack that time comes
out of the engine's cores, and 64 chats at one frame per ~140 ms step each gave up 5-15% of the engine's rate
(`python -m bench.serving`) while each got a token per step anyway. Up to 3 streams (125 x 30 ms) nothing
changes; the first token and the last text are never held; API streams (vLLM's clients time every token) are not
paced.

The streams wake the publisher (push, not polling): each stream's `on_put` schedules one wake-up on the
event loop, and a wake-up already pending is not scheduled again, so a step that fills a hundred streams
costs the engine loop thread one hop. Woken, the publisher drains every live stream; a request that sent
less than `interval` ago keeps its new text until then. It does not run while no request is live. So text
leaves as soon as the engine has queued it, or at most one `interval` after the request's previous message.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.layers import get_channel_layer

from .bridge import LoopBridge
from ..shared.naming import BATCH
from ..shared.retry import once_more

SEND_TIMEOUT_S = 10.0
LOOP_CHECK_S = 1.0  # a waiting task thread checks this often that the loop still runs

Chunk = dict[str, Any]  # {"index", "seq", "text", "tokens"}
Send = Callable[[str, dict[str, Any]], Awaitable[None]]  # the channel layer's send
Posted = tuple[dict[str, Any], concurrent.futures.Future[None]]  # a task thread's event and its poster's future


class Delta(Protocol):
    index: int
    text: str
    token_ids: list[int]


class DeltaSource(Protocol):
    on_put: Callable[[], None] | None  # set by the publisher; the source calls it after queuing each delta
    num_prompt_tokens: int

    def get(self, timeout: float | None = None) -> Delta | None:
        """Next delta; None once the stream has ended; raises queue.Empty after `timeout` seconds."""


@dataclass(eq=False)
class _Request:
    request_id: str
    source: DeltaSource
    reply_to: str  # the channel its events go to
    finished: concurrent.futures.Future[int] = field(default_factory=concurrent.futures.Future)
    pending: dict[int, list[str]] = field(default_factory=dict)  # unsent text per sample index
    # Tokens not yet counted in a sent chunk, per sample index; a delta without text (an incomplete UTF-8
    # character, a special token) is counted with the index's next text, except a sample's first (below).
    pending_tokens: dict[int, int] = field(default_factory=dict)
    opened: set[int] = field(default_factory=set)  # sample indices that have sent a chunk
    paced: bool = False  # its interval grows with the live requests (the module's docstring)
    seq: int = 0  # the next chunk's number
    last_send: float = float("-inf")
    ended: bool = False

    def drain(self) -> None:
        """Take every delta already in the stream, without waiting."""
        while not self.ended:
            try:
                delta = self.source.get(timeout=0)
            except queue.Empty:
                return
            if delta is None:
                self.ended = True
                continue
            self.pending_tokens[delta.index] = self.pending_tokens.get(delta.index, 0) + len(delta.token_ids)
            # A sample's first token goes out even without text: the client's time to first token is the
            # engine's (vLLM's server opens the stream then too), not that of the first token with text.
            if delta.text or delta.index not in self.opened:
                self.pending.setdefault(delta.index, []).append(delta.text)

    def take_event(self) -> dict[str, Any]:
        """The `gen.tokens` event of the text not sent yet (call only while some is pending)."""
        return {"type": "gen.tokens", "request_id": self.request_id, "prompt_tokens": self.source.num_prompt_tokens,
                "chunks": self.take_chunks()}

    def take_chunks(self) -> list[Chunk]:
        chunks = [{"index": i, "seq": self.seq + k, "text": "".join(parts), "tokens": self.pending_tokens.pop(i, 0)}
                  for k, (i, parts) in enumerate(sorted(self.pending.items()))]
        self.seq += len(chunks)
        self.opened.update(self.pending)
        self.pending.clear()
        return chunks


class TokenPublisher:
    def __init__(self, bridge: LoopBridge, interval: float, send: Send | None = None,
                 paced_events_per_s: float = 0.0) -> None:
        """Publish through `bridge`'s loop, at most one event per request per `interval` seconds, with `send`
        (the default channel layer's unless given); paced requests share `paced_events_per_s` (0: unpaced)."""
        self.bridge = bridge
        self.interval = interval
        self.paced_events_per_s = paced_events_per_s
        self._send = send
        self._live: list[_Request] = []  # touched on the loop only
        # Events posted by task threads, per channel, each with the future its poster waits on (loop only).
        self._outbox: dict[str, list[Posted]] = {}
        self._due_at: dict[str, float] = {}  # per channel of the outbox: when its events must go (loop time)
        self._wake = asyncio.Event()
        self._wakes_at = 0.0  # loop time at which the sleeping publisher looks again by itself; 0 while awake
        self._wake_pending = False  # a wake-up is scheduled on the loop and has not run yet
        self._task: asyncio.Task | None = None

    def publish(self, request_id: str, source: DeltaSource, reply_to: str,
                paced: bool = False) -> concurrent.futures.Future[int]:
        """Stream `source`'s text to channel `reply_to` (call from any thread), `paced` or not. The future
        resolves with the number of chunks sent once the stream has ended and all its text was sent, or with the
        error of a failed send; the request is then dropped (its owner aborts it), requests of other channels
        go on."""
        request = _Request(request_id, source, reply_to, paced=paced)
        source.on_put = self._notify
        self.bridge.loop.call_soon_threadsafe(self._add, request)
        return request.finished

    def post(self, reply_to: str, event: dict[str, Any], hold: bool = False) -> concurrent.futures.Future[None]:
        """Send `event` to channel `reply_to` at the head of the publisher's next message there (call from any
        thread), at once or, with `hold`, within one `interval`; the future resolves once it has gone, or with the
        send's error. Events posted from one thread keep their order. An event posted before a request is
        published precedes all its text (a request's `gen.accepted`); one posted after its stream has ended
        follows it (`gen.done`): the stream's last text has gone by then."""
        sent: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.bridge.loop.call_soon_threadsafe(self._post, reply_to, event, sent, hold)
        return sent

    def deliver(self, reply_to: str, event: dict[str, Any]) -> None:
        """`post`, then wait until the event has gone (blocking: call from a task thread, not the loop).
        Raises the send's error, or RuntimeError if the loop stops meanwhile."""
        self._wait(self.post(reply_to, event))

    def _post(self, reply_to: str, event: dict[str, Any], sent: concurrent.futures.Future[None], hold: bool) -> None:
        self._outbox.setdefault(reply_to, []).append((event, sent))
        due_at = self.bridge.loop.time() + (self.interval if hold else 0.0)
        self._due_at[reply_to] = min(due_at, self._due_at.get(reply_to, due_at))
        if hold and self._task is not None and not self._task.done() and self._wakes_at <= due_at:
            return  # the running publisher looks at the outbox by then anyway: no wake-up (and drain) per event
        self._start()

    def _notify(self) -> None:
        """A stream has new text (any thread): wake the publisher, unless a wake-up is already on its way.
        A flag read without a lock can only schedule a spare wake-up, never miss one: it is cleared on the
        loop before the event is set, and the publisher drains after the event is set."""
        if not self._wake_pending:
            self._wake_pending = True
            self.bridge.loop.call_soon_threadsafe(self._wake_up)

    def _wake_up(self) -> None:
        self._wake_pending = False
        self._wake.set()

    def stream(self, request_id: str, source: DeltaSource, reply_to: str, paced: bool = False) -> int:
        """`publish`, then wait for the future in the calling thread (a task thread). Raises RuntimeError if the
        loop stops meanwhile (the worker is shutting down), so the task ends instead of holding the shutdown."""
        return self._wait(self.publish(request_id, source, reply_to, paced))

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """The future's result, checking once per LOOP_CHECK_S that the loop still runs."""
        while True:
            try:
                return future.result(timeout=LOOP_CHECK_S)
            except concurrent.futures.TimeoutError:
                if not self.bridge.loop.is_running():
                    raise RuntimeError("the worker's event loop stopped") from None

    def _add(self, request: _Request) -> None:
        self._live.append(request)
        self._start()

    def _start(self) -> None:
        """Wake the publisher, and start it if it is not running (on the loop)."""
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        send = self._send or get_channel_layer().send
        loop = asyncio.get_running_loop()
        while self._live or self._outbox:  # ends when nothing is live or posted; the next one starts it again
            self._wake.clear()  # before draining: text queued from here on sets it again
            now = loop.time()
            due: dict[str, list[_Request]] = {channel: [] for channel in self._outbox if self._due_at[channel] <= now}
            for request in self._live:
                if self._ready(request, now):
                    due.setdefault(request.reply_to, []).append(request)
            posted = {channel: self._outbox.pop(channel) for channel in due if channel in self._outbox}
            for channel in posted:
                del self._due_at[channel]
            await asyncio.gather(*(self._flush(channel, requests, posted.get(channel, []), send, now)
                                   for channel, requests in due.items()))
            self._live = [r for r in self._live if not r.finished.done()]
            now = loop.time()
            delays = [self._sleep(request, now) for request in self._live] + [at - now for at in self._due_at.values()]
            if delays and min(delays) > 0:  # else all done, or an event came due while sending: round again
                self._wakes_at = now + min(delays)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(delays)):
                        await self._wake.wait()
                self._wakes_at = 0.0

    def _sleep(self, request: _Request, now: float) -> float:
        """How long the request lets the publisher sleep without a wake-up: until it may send its held text,
        else one interval (a wake-up comes with new text; the interval only bounds a source that never
        wakes anyone)."""
        if request.pending and (next_send := request.last_send + self._interval(request) - now) > 0:
            return next_send
        return self.interval

    def _interval(self, request: _Request) -> float:
        """The least time between two of the request's events: `interval`, or for a paced request while many
        are live, their share of `paced_events_per_s`."""
        if request.paced and self.paced_events_per_s > 0:
            return max(self.interval, len(self._live) / self.paced_events_per_s)
        return self.interval

    def _ready(self, request: _Request, now: float) -> bool:
        """Drain the request's stream; whether it has ended or has text it may send now. A stream that
        raises fails its request alone."""
        try:
            request.drain()
        except Exception as exc:
            request.finished.set_exception(exc)
            return False
        return request.ended or bool(request.pending) and now - request.last_send >= self._interval(request)

    @staticmethod
    async def _flush(channel: str, requests: list[_Request], posted: list[Posted], send: Send, now: float) -> None:
        """Send the `posted` events, then the unsent text of `requests` (all of `channel`), as one message;
        resolve the futures of the posters and of the requests whose stream has ended. A failed send fails
        every one of them."""
        try:
            sending = [request for request in requests if request.pending]
            events = [event for event, _ in posted] + [request.take_event() for request in sending]
            if events:
                message = {"type": BATCH, "events": events}
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    await once_more(lambda: send(channel, message))
                for request in sending:
                    request.last_send = now
            for _, sent in posted:
                sent.set_result(None)
            for request in requests:
                if request.ended:
                    request.finished.set_result(request.seq)
        except Exception as exc:
            for future in [sent for _, sent in posted] + [request.finished for request in requests]:
                if not future.done():
                    future.set_exception(exc)
