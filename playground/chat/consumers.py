"""ChatConsumer: the /ws/chat/ socket (protocol in docs/protocol.md).

Thin on purpose: it validates frames, persists turns, queues generations through `serving.dispatch`, and
relays what workers send to the request's group (`req.<request_id>`) back to the browser. A watchdog fails
any request whose worker stopped heart-beating, so a dead worker gives the client an error, never a hang.
"""
import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from playground.accounts import limits, salt
from playground.serving.web import dispatch
from playground.serving.web import liveness
from playground.serving.shared.naming import GPU_QUEUE, request_group
from playground.serving.web.sampling import InvalidInput

from . import store
from .protocol import Cancel, Generate, decode_frame, parse_cancel, parse_generate

logger = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 1.0
CLOSE_LOGIN_REQUIRED = 4401


@dataclass
class Pending:
    """A generation this socket started that has not finished yet."""

    conversation_id: uuid.UUID
    admission: limits.Admission  # the user's concurrency slot, given back when the request ends
    queue: str = GPU_QUEUE
    worker: str = ""  # set once a worker accepted it
    queued_at: float = field(default_factory=time.monotonic)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.pending: dict[str, Pending] = {}
        self.watchdog: asyncio.Task | None = None
        user = self.scope.get("user")
        if not settings.PLAYGROUND_ALLOW_ANONYMOUS and not (user and user.is_authenticated):
            await self.close(code=CLOSE_LOGIN_REQUIRED)
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for request_id in list(getattr(self, "pending", {})):
            await dispatch.abort(request_id)
            await self.forget(request_id)
        if getattr(self, "watchdog", None) is not None:
            self.watchdog.cancel()

    # --- from the browser -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            frame = decode_frame(text_data, settings.PLAYGROUND_LIMITS["max_frame_bytes"])
            kind = frame.get("type")
            if kind == "generate":
                await self.generate(
                    parse_generate(frame, settings.PLAYGROUND_SAMPLING_DEFAULTS, settings.PLAYGROUND_LIMITS)
                )
            elif kind == "cancel":
                await self.cancel(parse_cancel(frame))
            else:
                raise InvalidInput("type must be 'generate' or 'cancel'")
        except (InvalidInput, store.ConversationNotFound) as exc:
            await self.send_json({"type": "error", "message": str(exc)})
        except Exception:  # a server fault (database down...): say so, keep the socket and its other requests
            logger.exception("failed to handle a frame")
            await self.send_json({"type": "error", "message": "internal server error"})

    async def generate(self, request: Generate) -> None:
        user, session_key = self.scope.get("user"), await self.session_key()
        # Over the user's limits: LimitExceeded, an InvalidInput, becomes an error event.
        admission = await database_sync_to_async(limits.admit_user)(user, session_key)
        try:
            conversation = await database_sync_to_async(store.open_conversation)(
                user, session_key, request.conversation_id, request.messages
            )
        except BaseException:
            await admission.arelease()
            raise
        request_id = uuid.uuid4().hex
        await self.channel_layer.group_add(request_group(request_id), self.channel_name)
        self.pending[request_id] = pending = Pending(conversation.id, admission)
        await self.send_json({"type": "started", "request_id": request_id, "conversation_id": str(conversation.id)})
        try:
            pending.queue = await sync_to_async(dispatch.submit, thread_sensitive=False)(
                request_id, request.messages, request.params, conversation.last_worker, salt.cache_salt(admission.who)
            )
        except Exception:
            logger.exception("could not queue request %s", request_id)
            await self.fail(request_id, "could not queue the request: the task broker is unavailable")
            return
        if self.watchdog is None or self.watchdog.done():
            self.watchdog = asyncio.create_task(self.watch())

    async def cancel(self, request: Cancel) -> None:
        if request.request_id not in self.pending:
            raise InvalidInput(f"no running request {request.request_id!r} on this socket")
        await dispatch.abort(request.request_id)

    # --- from the worker (channel-layer group req.<request_id>) -------------------------------------
    async def gen_accepted(self, event: dict[str, Any]) -> None:
        pending = self.pending.get(event["request_id"])
        if pending is not None:
            pending.worker = event["worker"]

    async def gen_tokens(self, event: dict[str, Any]) -> None:
        request_id = event["request_id"]
        if request_id not in self.pending:
            return
        for chunk in event["chunks"]:
            await self.send_json({"type": "token", "request_id": request_id, **chunk})

    async def gen_done(self, event: dict[str, Any]) -> None:
        request_id = event["request_id"]
        pending = await self.forget(request_id)
        if pending is None:
            return
        await pending.admission.arecord(event["usage"]["prompt_tokens"] + event["usage"]["completion_tokens"])
        done = {key: event[key] for key in ("outputs", "usage", "timing")}
        try:
            await database_sync_to_async(store.save_reply)(pending.conversation_id, request_id, done, event["worker"])
        except Exception:
            logger.exception("could not save the reply of %s", request_id)
        await self.send_json(
            {
                "type": "done",
                "request_id": request_id,
                "conversation_id": str(pending.conversation_id),
                "worker": event["worker"],
                **done,
            }
        )

    async def gen_error(self, event: dict[str, Any]) -> None:
        await self.fail(event["request_id"], event["message"])

    # --- bookkeeping ------------------------------------------------------------------------------
    async def fail(self, request_id: str, message: str) -> None:
        if await self.forget(request_id) is not None:
            await self.send_json({"type": "error", "request_id": request_id, "message": message})

    async def forget(self, request_id: str) -> Pending | None:
        pending = self.pending.pop(request_id, None)
        if pending is not None:
            await self.channel_layer.group_discard(request_group(request_id), self.channel_name)
            await pending.admission.arelease()
        return pending

    async def session_key(self) -> str:
        """The anonymous owner key; a socket without a session yet gets a fresh one."""
        session = self.scope.get("session")
        if session is None:
            return ""
        if not session.session_key:
            await database_sync_to_async(session.save)()
        return session.session_key

    async def watch(self) -> None:
        """Fail requests whose worker died or that no worker will ever pick up."""
        while self.pending:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            for request_id, pending in list(self.pending.items()):
                try:
                    problem = await self.problem_with(pending)
                except Exception:  # registry unreachable: judge again next round
                    logger.exception("watchdog could not check request %s", request_id)
                    continue
                if problem is not None:
                    await dispatch.abort(request_id)
                    await self.fail(request_id, problem)

    @staticmethod
    async def problem_with(pending: Pending) -> str | None:
        return await liveness.problem_with(pending)
