"""Persistence of chat turns: the transcript a generate frame answers, then the reply its `done` carries.

Sync functions: the consumer calls them through `database_sync_to_async`.
"""
from uuid import UUID

from django.db import transaction

from .models import Conversation, Message

TITLE_CHARS = 60


class ConversationNotFound(LookupError):
    """The conversation does not exist or belongs to someone else (the two are not told apart)."""


def open_conversation(
    user, session_key: str, conversation_id: UUID | None, messages: list[dict[str, str]]
) -> Conversation:
    """Return the caller's conversation (a new one when no id is given) holding exactly `messages`.

    Stored messages that match the start of `messages` are kept with their stats; the rest are replaced,
    which is what editing a turn or regenerating a reply means.
    """
    owner = {"user": user} if user is not None and user.is_authenticated else {"session_key": session_key}
    with transaction.atomic():
        if conversation_id is None:
            conversation = Conversation.objects.create(**owner)
        else:
            conversation = (
                Conversation.objects.owned_by(user, session_key).select_for_update().filter(id=conversation_id).first()
            )
            if conversation is None:
                raise ConversationNotFound(f"conversation {conversation_id} not found")
        stored = list(conversation.messages.order_by("position"))
        keep = 0
        while keep < min(len(stored), len(messages)) and (
            stored[keep].role == messages[keep]["role"] and stored[keep].content == messages[keep]["content"]
        ):
            keep += 1
        conversation.messages.filter(position__gte=keep).delete()
        Message.objects.bulk_create(
            Message(conversation=conversation, position=i, role=m["role"], content=m["content"])
            for i, m in enumerate(messages[keep:], start=keep)
        )
        if not conversation.title:
            first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
            conversation.title = " ".join(first_user.split())[:TITLE_CHARS]
        conversation.save()
    return conversation


def save_reply(conversation_id: UUID, request_id: str, done: dict, worker: str) -> Message:
    """Append the assistant reply of a finished request and remember which worker holds its prefix."""
    outputs = sorted(done["outputs"], key=lambda o: o["index"])
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(id=conversation_id)
        position = conversation.messages.count()
        message = Message.objects.create(
            conversation=conversation,
            position=position,
            role=Message.Role.ASSISTANT,
            content=outputs[0]["text"] if outputs else "",
            samples=[o["text"] for o in outputs] if len(outputs) > 1 else None,
            finish_reason=(outputs[0]["finish_reason"] or "") if outputs else "",
            usage=done.get("usage"),
            timing=done.get("timing"),
            request_id=request_id,
            worker=worker,
        )
        conversation.last_worker = worker
        conversation.save(update_fields=["last_worker", "updated_at"])
    return message


def conversation_detail(conversation: Conversation) -> dict:
    """The JSON shape of one conversation (docs/protocol.md)."""
    messages = [m.as_dict() for m in conversation.messages.order_by("position")]
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    return {
        **conversation_summary(conversation),
        "system_prompt": system,
        "messages": messages,
    }


def conversation_summary(conversation: Conversation) -> dict:
    return {"id": str(conversation.id), "title": conversation.title, "updated_at": conversation.updated_at.isoformat()}
