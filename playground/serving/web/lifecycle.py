"""Web-side generation from code that is not a websocket consumer (the OpenAI API views, the demo runner).

`generate()` does what the chat consumer does for a socket, for one request: it listens on a fresh
channel-layer channel in the request's group `req.<id>`, queues the Celery task through `dispatch`, yields
the worker's events, and fails the request when its worker dies or nobody picks it up (`liveness`). Leaving
the iteration early (client gone, caller cancelled) aborts the request in the engine.
"""
import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from . import dispatch, liveness
from ..shared.naming import request_group


class GenerationFailed(RuntimeError):
    """The request could not be served; `code` says whose fault: "invalid_request" (the client's: e.g. a
    prompt too long for the model), "unavailable" or "server_error"."""

    def __init__(self, message: str, code: str = "server_error") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Job:
    """One generation: a chat transcript (`messages`) or a plain `prompt`, with SamplingParams kwargs."""

    params: dict[str, Any]
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    cache_salt: str | None = None
    preferred_worker: str = ""
    request_id: str = ""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a Job needs exactly one of messages and prompt")
        if not self.request_id:
            object.__setattr__(self, "request_id", uuid.uuid4().hex)


async def generate(job: Job) -> AsyncIterator[dict[str, Any]]:
    """Yield the worker's `gen.tokens` events, then its `gen.done` event; raise GenerationFailed instead
    of `gen.error` (or when the worker dies). Event shapes: docs/protocol.md, "Inside"."""
    layer = get_channel_layer()
    channel = await layer.new_channel("gen.")
    group = request_group(job.request_id)
    await layer.group_add(group, channel)
    receiving: asyncio.Future | None = None
    finished = False
    try:
        try:
            queue = await sync_to_async(dispatch.submit, thread_sensitive=False)(
                job.request_id, job.messages, job.params, job.preferred_worker, job.cache_salt, job.prompt
            )
        except Exception as exc:
            message = "could not queue the request: the task broker is unavailable"
            raise GenerationFailed(message, "unavailable") from exc
        pending = liveness.Pending(queue)
        while True:
            receiving = receiving or asyncio.ensure_future(layer.receive(channel))
            done, _ = await asyncio.wait({receiving}, timeout=liveness.CHECK_INTERVAL_S)
            if not done:
                problem = await liveness.problem_with(pending)
                if problem is not None:
                    raise GenerationFailed(problem, "unavailable")
                continue
            event, receiving = receiving.result(), None
            kind = event.get("type")
            if kind == "gen.accepted":
                pending.worker = event["worker"]
            elif kind == "gen.tokens":
                yield event
            elif kind == "gen.done":
                finished = True
                yield event
                return
            elif kind == "gen.error":
                finished = True
                raise GenerationFailed(event["message"], event.get("code", "server_error"))
    finally:
        if receiving is not None:
            receiving.cancel()
        if not finished:
            await dispatch.abort(job.request_id)
        await layer.group_discard(group, channel)
