"""The one request lifecycle of the web side, used by the chat socket, the OpenAI API and the demo alike:

    admit (limits) -> start (listen, submit) -> updates (stream) -> finish / abort / fail -> close (release)

`admit()` takes the user's concurrency slot and returns a `Generation`; from then on the slot is given back
by `Generation.close()`, which runs on every path (use `async with generation:`): finished, cancelled,
failed, or any exception anywhere after admission (the broker refusing the task after a Redis restart, a
database error, the client going away). `close()` never raises and is idempotent.

Worker events reach the request through its web process's inbox (one channel-layer channel per process,
inbox.py; its name travels as `Job.reply_to`), whose one receiving task puts them into the request's
`Collector` (vLLM's RequestOutputCollector): text that arrives while the reader is busy is merged per
sample, and the reader is woken by an event, not by polling.
While nothing arrives the reader checks once per CHECK_INTERVAL_S that the request can still finish
(`liveness`): worker alive and healthy, reply not lost, deadline not passed. So every accepted request
ends with its reply or a `GenerationFailed`, within `PLAYGROUND_REQUEST_DEADLINE_S` at the latest.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings

from playground import logs

from ..shared.envelope import Job
from . import dispatch, inbox, liveness

logger = logging.getLogger(__name__)

REAPER_GRACE_S = 5.0
ABORT_RETRY_S = 30.0
ABORT_RETRY_EVERY_S = 2.0


class GenerationFailed(RuntimeError):
    """The request could not be served; `code` says whose fault: "invalid_request" (the client's: e.g. a
    prompt too long for the model), "unavailable", "timeout" or "server_error"."""

    def __init__(self, message: str, code: str = "server_error") -> None:
        super().__init__(message)
        self.code = code


class Slot(Protocol):
    """A concurrency slot (playground.accounts.limits.Admission); blocking calls, run off the event loop."""

    def release(self) -> None: ...

    def record(self, tokens: int) -> None: ...


class _NoSlot:
    """For callers without limits (the demo's simulated users)."""

    def release(self) -> None:
        pass

    def record(self, tokens: int) -> None:
        pass


Chunk = dict[str, Any]  # {"index", "seq", "text"}


@dataclass
class Update:
    """What the reader gets at once: the text that arrived since its last look (one chunk per sample, `seq`
    counting this request's chunks from 0 without gaps), and the worker's `gen.done` event once it ended.
    `tokens` counts each sample's tokens streamed so far, and `prompt_tokens` is the prompt's length once the
    worker has said it (the API's `continuous_usage_stats`)."""

    chunks: list[Chunk]
    done: dict[str, Any] | None = None
    tokens: dict[int, int] = field(default_factory=dict)
    prompt_tokens: int | None = None


@dataclass(eq=False)
class Collector:
    """The worker's events of one request, merged for a reader that may lag (touched on one event loop)."""

    worker: str = ""  # set by `gen.accepted`
    _text: dict[int, list[str]] = field(default_factory=dict)
    _seq: int = 0  # the next chunk's number, as the reader sees them
    _worker_seq: int = 0  # the next chunk number expected from the worker; lower ones were seen already
    _tokens: dict[int, int] = field(default_factory=dict)  # per sample, tokens received so far
    _prompt_tokens: int | None = None
    _done: dict[str, Any] | None = None
    _failure: GenerationFailed | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "gen.accepted":
            self.worker = event["worker"]
        elif kind == "gen.tokens":
            self._prompt_tokens = event.get("prompt_tokens", self._prompt_tokens)
            for chunk in event["chunks"]:
                if chunk["seq"] < self._worker_seq:  # a retried send delivered twice
                    continue
                self._worker_seq = chunk["seq"] + 1
                self._text.setdefault(chunk["index"], []).append(chunk["text"])
                self._tokens[chunk["index"]] = self._tokens.get(chunk["index"], 0) + chunk.get("tokens", 0)
        elif kind == "gen.done":
            self._done = event
        elif kind == "gen.error":
            self.fail(GenerationFailed(event["message"], event.get("code", "server_error")))
            return
        self._ready.set()

    def fail(self, failure: GenerationFailed) -> None:
        if self._failure is None and self._done is None:
            self._failure = failure
        self._ready.set()

    @property
    def finished(self) -> bool:
        return self._done is not None

    @property
    def ended(self) -> bool:
        return self._done is not None or self._failure is not None

    async def take(self, timeout: float) -> Update | None:
        """Everything new, waiting up to `timeout` seconds for something; None if nothing came. Raises the
        request's GenerationFailed once it failed (text not yet taken is dropped with it)."""
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return None
        self._ready.clear()
        if self._failure is not None:
            raise self._failure
        chunks = [{"index": i, "seq": self._seq + k, "text": "".join(parts)}
                  for k, (i, parts) in enumerate(sorted(self._text.items()))]
        self._seq += len(chunks)
        self._text.clear()
        return Update(chunks, self._done, dict(self._tokens), self._prompt_tokens)


async def admit(take_slot: Callable[[], Slot] | None = None) -> Generation:
    """Take a slot (`take_slot` runs in a thread and may raise LimitExceeded) and start a lifecycle."""
    slot = _NoSlot() if take_slot is None else await sync_to_async(take_slot, thread_sensitive=False)()
    return Generation(slot)


class Generation:
    """One request on the web side, from its admission to its release. Not reusable."""

    def __init__(self, slot: Slot) -> None:
        self.request_id = uuid.uuid4().hex
        self.collector = Collector()
        self.progress = liveness.Progress(deadline=time.monotonic() + settings.PLAYGROUND_REQUEST_DEADLINE_S)
        self._slot = slot
        self._inbox: inbox.Inbox | None = None  # set once the request listens
        self._tokens = 0
        self._closing: asyncio.Future | None = None
        # The last resort, for a caller that never reaches close() (a streamed response nobody iterated):
        # shortly after the deadline, whatever happened, the slot is given back.
        self._reaper = asyncio.get_running_loop().call_later(
            settings.PLAYGROUND_REQUEST_DEADLINE_S + REAPER_GRACE_S, self._reap
        )

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- start and stream ----------------------------------------------------------------------------
    async def start(self, job: Job) -> None:
        """Listen on the process's inbox, then queue the task; raises GenerationFailed("unavailable") when
        the channel layer or the broker cannot be reached."""
        logs.request_id.set(self.request_id)  # the relaying task's log lines from here on (playground/logs.py)
        try:
            listening = inbox.current()
            reply_to = await listening.open(self.request_id, self.collector)
            self._inbox = listening
        except Exception as exc:
            logger.exception("channel layer failed for request %s", self.request_id)
            raise GenerationFailed("the server lost its channel layer (Redis); try again", "unavailable") from exc
        try:
            self.progress.queue = await dispatch.submit(self.request_id, replace(job, reply_to=reply_to))
        except Exception as exc:
            logger.exception("could not queue request %s", self.request_id)
            raise GenerationFailed("could not queue the request: the task broker is unavailable",
                                   "unavailable") from exc

    async def updates(self) -> AsyncIterator[Update]:
        """The request's updates until the one carrying `done`; raises GenerationFailed instead of the
        worker's `gen.error`, and when the request can no longer finish (liveness)."""
        while True:
            update = await self.collector.take(liveness.CHECK_INTERVAL_S)
            problem = self.progress.past_deadline()  # checked while text flows too
            if update is None and problem is None:
                try:
                    problem = await liveness.problem_with(self.progress, self.collector.worker, self.request_id)
                except Exception:  # the registry is unreachable: judge again next round (the deadline holds)
                    logger.exception("could not check on request %s", self.request_id)
            if problem is not None:
                message, code = problem
                self.collector.fail(GenerationFailed(message, code))
                continue
            if update is None:
                continue
            if not update.chunks and update.done is None:  # `gen.accepted`: nothing to show
                continue
            if update.done is not None:
                usage = update.done["usage"]
                self._tokens = usage["prompt_tokens"] + usage["completion_tokens"]
            yield update
            if update.done is not None:
                return

    async def cancel(self) -> None:
        """Ask the worker to abort; the request still ends with its `done` (finish_reason "abort")."""
        await dispatch.abort(self.request_id)

    # --- the end -------------------------------------------------------------------------------------
    def _reap(self) -> None:
        self._closing = asyncio.ensure_future(self._close())

    async def close(self) -> None:
        """Abort the request if unfinished, stop listening, give the slot back and count the tokens used.
        Every step is attempted whatever the others did; nothing raises. The work runs in a task of its own
        that the caller's cancellation does not interrupt (a socket closing while its request ends)."""
        if self._closing is None:
            self._reaper.cancel()
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _abort(self) -> None:
        """Ask the workers to abort; if the channel layer is down (a Redis restart), keep asking in the
        background, so the worker does not generate for nobody once Redis is back."""
        try:
            await dispatch.abort(self.request_id)
        except Exception:
            logger.warning("could not abort request %s now; retrying in the background", self.request_id)
            task = asyncio.ensure_future(_abort_later(self.request_id))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _close(self) -> None:
        if self._inbox is not None:
            self._inbox.close(self.request_id)
            if not self.collector.finished:
                await self._abort()

        def settle() -> None:
            self._slot.release()
            self._slot.record(self._tokens)

        await _quietly(sync_to_async(settle, thread_sensitive=False)(), "release the slot of", self.request_id)


_background: set[asyncio.Task] = set()  # abort retries outlive their Generation


async def _abort_later(request_id: str) -> None:
    """Send the abort every ABORT_RETRY_EVERY_S for ABORT_RETRY_S, even after a send succeeds: a worker rejoins
    the control group a moment after Redis is back, and an abort sent before that reaches no one (a
    worker ignores aborts of requests it does not run)."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + ABORT_RETRY_S
    while loop.time() < give_up_at:
        await asyncio.sleep(ABORT_RETRY_EVERY_S)
        with contextlib.suppress(Exception):
            await dispatch.abort(request_id)


async def _quietly(step: Any, what: str, request_id: str) -> None:
    try:
        await step
    except Exception:
        logger.exception("could not %s request %s", what, request_id)
