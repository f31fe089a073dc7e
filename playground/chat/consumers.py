"""ChatConsumer: the /ws/chat/ socket (protocol in docs/protocol.md).

Thin on purpose: it parses frames (`protocol`), persists turns (`store`, batched by `transcripts`) and relays
each generation's updates; the request's lifecycle — limits, queueing, listening, liveness, release — is
`serving.web.lifecycle`'s, the same as the API's and the demo's. A compare frame runs two such generations at
once (settings A and B on one prompt), admitted both or neither and saved nowhere. The socket has no channel-layer channel of
its own (each request listens on its own), so a channel layer that fails (Redis restarting) fails the
requests it carried with an error frame and leaves the socket open, instead of closing it with 1011.
"""
import asyncio
import logging
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from playground.accounts import limits, salt
from playground.accounts.access import may_use_playground
from playground.serving.web import lifecycle, models, sampling
from playground.serving.web.edge import InvalidInput
from playground.serving.web.lifecycle import Generation, GenerationFailed, Job

from . import store, transcripts
from .protocol import CLOSE_LOGIN_REQUIRED, Cancel, Compare, Generate, parse_frame

logger = logging.getLogger(__name__)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    channel_layer_alias = None  # no channel of its own: see the module docstring

    async def connect(self) -> None:
        self.running: dict[str, tuple[Generation, asyncio.Task]] = {}
        if not may_use_playground(self.scope.get("user")):
            await self.close(code=CLOSE_LOGIN_REQUIRED)
            return
        await self.accept()

    async def disconnect(self, code: int) -> None:
        """End every running generation: each aborts its request and gives its slot back."""
        running = list(getattr(self, "running", {}).values())
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        await asyncio.gather(*(generation.close() for generation, _ in running))

    # --- from the browser -------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            caps = settings.PLAYGROUND_LIMITS
            request = parse_frame(text_data, sampling.defaults(caps), caps)
            if isinstance(request, Generate):
                await self.generate(request)
            elif isinstance(request, Compare):
                await self.compare(request)
            else:
                await self.cancel(request)
        except (InvalidInput, store.ConversationNotFound) as exc:
            await self.send_json({"type": "error", "message": str(exc)})
        except Exception:  # a server fault (database down...): say so, keep the socket and its other requests
            logger.exception("failed to handle a frame")
            await self.send_json({"type": "error", "message": "internal server error"})

    async def generate(self, request: Generate) -> None:
        """Admit, start the generation, store the transcript and answer `started` here (so frames are answered in
        order); the relay streams in its own task, from after `started`. The engine starts on the request before
        the transcript is written: a burst of turns queues its writes on the one database thread, and waiting
        for them held each turn back from the engine's batch (64 new chats at once reached the engine over half
        a second, `python -m bench.serving`)."""
        adapter = models.adapter_for(request.model)  # an unknown model: UnknownModel, an error frame
        user, session_key = self.scope.get("user"), await self.session_key()
        address = (self.scope.get("client") or ("",))[0]
        # Over the user's limits: LimitExceeded, an InvalidInput, becomes an error frame.
        generation = await lifecycle.admit(lambda: limits.admit_user(user, session_key, address))
        worker = ""  # a new conversation has no worker yet, and does not queue behind other turns' writes to say so
        if request.conversation_id is not None:
            try:
                # Someone else's conversation: ConversationNotFound, an error frame, before the engine sees anything.
                worker = await database_sync_to_async(store.last_worker)(user, session_key, request.conversation_id)
            except BaseException:
                await generation.close()
                raise
        job = Job(request.params, request.messages, cache_salt=salt.cache_salt(limits.identity(user, session_key)),
                  preferred_worker=worker, adapter=adapter, fit_window=True, paced=True)
        saving = asyncio.get_running_loop().create_future()
        self.start_relay(generation, job, saving)
        try:
            conversation = await transcripts.open_conversation(user, session_key, request.conversation_id,
                                                               request.messages)
            await self.send_json({"type": "started", "request_id": generation.request_id,
                                  "conversation_id": str(conversation.id)})
        except BaseException:
            saving.cancel()  # the relay ends the generation without a frame; this frame's error is the answer
            raise
        # The reply answers the last message sent (the leaf now), wherever the branch shown is by then.
        saving.set_result((conversation.id, conversation.leaf_id))

    async def compare(self, request: Compare) -> None:
        """Admit both sides or neither (a refused B gives A's slot back at once), answer `compare_started` with
        their ids in order, then stream each in its own task. Nothing is stored: a compare run tries settings on
        one prompt, and the conversation keeps one line of replies (docs/protocol.md)."""
        adapters = [models.adapter_for(side.model) for side in request.sides]  # all refusals before any slot
        user, session_key = self.scope.get("user"), await self.session_key()
        address = (self.scope.get("client") or ("",))[0]
        generations: list[Generation] = []
        try:
            try:
                for _ in request.sides:
                    generations.append(await lifecycle.admit(lambda: limits.admit_user(user, session_key, address)))
            except limits.LimitExceeded as exc:
                raise InvalidInput(f"compare streams two replies at once and needs two request slots: {exc}") from exc
            cache_salt = salt.cache_salt(limits.identity(user, session_key))
            jobs = [Job(side.params, side.messages, cache_salt=cache_salt, adapter=adapter, fit_window=True, paced=True)
                    for side, adapter in zip(request.sides, adapters)]
            await self.send_json({"type": "compare_started", "request_ids": [g.request_id for g in generations]})
        except BaseException:
            await asyncio.gather(*(generation.close() for generation in generations))
            raise
        for generation, job in zip(generations, jobs):
            self.start_relay(generation, job, saving=None)

    async def cancel(self, request: Cancel) -> None:
        if request.request_id not in self.running:
            raise InvalidInput(f"no running request {request.request_id!r} on this socket")
        await self.running[request.request_id][0].cancel()

    # --- one generation ---------------------------------------------------------------------------
    def start_relay(self, generation: Generation, job: Job,
                    saving: asyncio.Future[tuple[UUID, int]] | None) -> None:
        task = asyncio.create_task(self.relay(generation, job, saving))
        self.running[generation.request_id] = (generation, task)

    async def relay(self, generation: Generation, job: Job, saving: asyncio.Future[tuple[UUID, int]] | None) -> None:
        """Start one generation and stream it to the browser: token frames, then `done` or `error`. `saving`
        resolves, once `started` is sent, to the conversation and the message the reply is saved under; None
        for a compare side; cancelled when the transcript could not be stored (the generation ends unheard)."""
        request_id = generation.request_id
        try:
            async with generation:
                await generation.start(job)
                saved_under = await self._after_started(saving)
                async for update in generation.updates():
                    for chunk in update.chunks:
                        await self.send_json({"type": "token", "request_id": request_id, **chunk})
                    if update.done is not None:
                        # The slot is free (and the tokens counted) before the browser hears `done`: a next turn
                        # sent at once must not meet this request's slot, nor its database write.
                        await generation.close()
                        await self.finish(request_id, update.done, saved_under)
        except GenerationFailed as exc:
            await self._after_started(saving)
            await self.send_json({"type": "error", "request_id": request_id, "message": str(exc)})
        except Exception:
            logger.exception("request %s failed", request_id)
            await self._after_started(saving)
            await self.send_json({"type": "error", "request_id": request_id, "message": "internal server error"})
        finally:
            self.running.pop(request_id, None)

    @staticmethod
    async def _after_started(saving: asyncio.Future[tuple[UUID, int]] | None) -> tuple[UUID, int] | None:
        """Wait until `started` has gone out (a request's frames follow it) and return where the reply is saved
        (None for a compare side); raises CancelledError if it never will, so the request ends without a frame."""
        return None if saving is None else await saving

    async def finish(self, request_id: str, event: dict[str, Any], saving: tuple[UUID, int] | None) -> None:
        done = {key: event[key] for key in ("outputs", "usage", "timing")}
        stored = {}
        if saving is not None:
            conversation_id, parent_id = saving
            saved = None
            try:
                saved = await transcripts.save(store.Reply(conversation_id, request_id, done, event["worker"], parent_id))
                if saved is None:
                    logger.warning("the reply of %s was not saved: its conversation was deleted", request_id)
            except Exception:
                logger.exception("could not save the reply of %s", request_id)
            stored = {"conversation_id": str(conversation_id), "message_id": saved.id if saved else None}
        # The cache receipt, the prompt's provenance segments and what the window left out are shown live, not
        # stored.
        live = {key: event[key] for key in ("receipt", "prompt_segments", "context") if key in event}
        await self.send_json({"type": "done", "request_id": request_id, **stored, "worker": event["worker"], **done,
                              **live})

    async def session_key(self) -> str:
        """The anonymous owner key; a socket without a session yet gets a fresh one."""
        session = self.scope.get("session")
        if session is None:
            return ""
        if not session.session_key:
            await database_sync_to_async(session.save)()
        return session.session_key
