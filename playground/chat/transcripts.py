"""The chat sockets' transcript writes (run on the web process's event loop): the conversations a burst of
chats starts are created together, and replies that end together are stored together (serving.web.batching).

A burst of chats started at once each wrote its new conversation in a transaction of its own, queued on the one
database thread beside the engine's work (~0.7 ms of the web process's CPU apiece, Django's saves); those
chats then end in one engine step, and their replies saved one transaction each left the last `done` frame
~0.2 s after the engine's last token (64 chats, `python -m bench.serving`). Here the first write goes at once
and every write that arrives while it runs goes in the next (`store.create_conversations`,
`store.save_replies`). A turn in an existing conversation is matched against its stored tree alone.
"""
from __future__ import annotations

from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async

from playground.serving.web.batching import Batcher, per_loop

from . import store
from .models import Conversation, Message


async def _create(batch: list[store.NewConversation]) -> list[Conversation]:
    return await database_sync_to_async(store.create_conversations)(batch)


async def _save(batch: list[store.Reply]) -> list[Message | None]:
    return await database_sync_to_async(store.save_replies)(batch)


_creator = per_loop(lambda: Batcher(_create))
_writer = per_loop(lambda: Batcher(_save))


async def open_conversation(user: Any, session_key: str, conversation_id: UUID | None,
                            messages: list[dict[str, str]]) -> Conversation:
    """`store.open_conversation` for a generate frame: a new conversation is created with those beside it."""
    if conversation_id is None:
        return await _creator().submit(store.NewConversation(user, session_key, messages))
    return await database_sync_to_async(store.open_conversation)(user, session_key, conversation_id, messages)


async def save(reply: store.Reply) -> Message | None:
    """Store `reply` with those queued beside it: its message, or None when its conversation is gone. Raises
    what the database raised for its batch. A caller cancelled meanwhile does not unqueue it."""
    return await _writer().submit(reply)
