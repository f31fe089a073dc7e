"""Persistence of chat turns: the transcript a generate frame answers, then the reply its `done` carries.

Sync functions: the consumer calls them through `database_sync_to_async`.
"""
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from playground.serving.web.edge import InvalidInput

from .models import TITLE_MAX_CHARS, Conversation, Message

TITLE_CHARS = 60


class ConversationNotFound(LookupError):
    """The conversation does not exist or belongs to someone else (the two are not told apart)."""


def last_worker(user, session_key: str, conversation_id: UUID) -> str:
    """The worker that answered the caller's conversation last ("" for one never answered), the worker whose
    prefix cache likely holds its turns. Raises ConversationNotFound for a conversation the caller does not own."""
    worker = Conversation.objects.owned_by(user, session_key).filter(id=conversation_id).values_list(
        "last_worker", flat=True).first()
    if worker is None:
        raise ConversationNotFound(f"conversation {conversation_id} not found")
    return worker


def open_conversation(
    user, session_key: str, conversation_id: UUID | None, messages: list[dict[str, str]]
) -> Conversation:
    """Return the caller's conversation (a new one when no id is given) whose shown branch is exactly `messages`.

    The messages are matched against the tree from its root: a stored message with the same role and content
    under the same parent is reused (with its stats), preferring the one on the branch shown; the first that
    differs starts a new branch beside the old one, which stays. So an edited message or a regenerated reply
    keeps what it replaces. The conversation's `leaf` becomes the last of `messages`.
    """
    if conversation_id is None:
        (conversation,) = create_conversations([NewConversation(user, session_key, messages)])
        return conversation
    with transaction.atomic():
        conversation = (
            Conversation.objects.owned_by(user, session_key).select_for_update().filter(id=conversation_id).first()
        )
        if conversation is None:
            raise ConversationNotFound(f"conversation {conversation_id} not found")
        children: dict[int | None, list[Message]] = {}
        for stored in conversation.messages.order_by("id"):
            children.setdefault(stored.parent_id, []).append(stored)
        shown = {m.id for m in active_path(conversation)}
        parent = None
        for i, message in enumerate(messages):
            same = [c for c in children.get(parent.id if parent else None, [])
                    if c.role == message["role"] and c.content == message["content"]]
            if same:
                parent = next((c for c in same if c.id in shown), same[-1])
            else:
                parent = Message.objects.create(conversation=conversation, parent=parent, position=i,
                                                role=message["role"], content=message["content"])
        conversation.leaf = parent
        if not conversation.title:
            conversation.title = title_of(messages)
        conversation.save()
    return conversation


@dataclass(frozen=True)
class NewConversation:
    """A conversation a generate frame without a conversation id starts: its owner and its first transcript."""

    user: Any
    session_key: str
    messages: list[dict[str, str]]


def create_conversations(new: list[NewConversation]) -> list[Conversation]:
    """Store new conversations, each with its messages as one branch shown, in one transaction: one INSERT for
    the conversations, one per message position, one UPDATE of their leaves, however many there are. Nothing
    is read back: a burst of new chats runs this on the one database thread while their requests are on their way
    to the engine (64 of them, one transaction each, cost the web process ~0.7 ms of CPU apiece: Django's
    per-object saves, not the commits)."""
    with transaction.atomic():
        conversations = Conversation.objects.bulk_create(
            [Conversation(**owner_fields(one.user, one.session_key), title=title_of(one.messages)) for one in new])
        leaves: list[Message | None] = [None] * len(new)
        for position in range(max((len(one.messages) for one in new), default=0)):
            level = {i: Message(conversation=conversation, parent=leaves[i], position=position,
                                role=one.messages[position]["role"], content=one.messages[position]["content"])
                     for i, (conversation, one) in enumerate(zip(conversations, new)) if position < len(one.messages)}
            Message.objects.bulk_create(level.values())  # sets their ids (RETURNING): the next level's parents
            for i, message in level.items():
                leaves[i] = message
        for conversation, leaf in zip(conversations, leaves):
            conversation.leaf = leaf
        Conversation.objects.bulk_update(conversations, ["leaf"])
    return conversations


def title_of(messages: list[dict[str, str]]) -> str:
    """A conversation's default title: its first user message, on one line, cut short."""
    first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
    return " ".join(first_user.split())[:TITLE_CHARS]


def owner_fields(user, session_key: str) -> dict:
    """The owner of a conversation this caller creates: the signed-in user, else the anonymous session."""
    return {"user": user} if user is not None and user.is_authenticated else {"session_key": session_key}


def one_line(value: Any, field: str, max_chars: int) -> str:
    """A name the user typed (a conversation's title, a preset's name) as one line: runs of whitespace become one
    space; a non-string, an empty name or one over `max_chars` is refused naming `field`."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field}: must be a string")
    name = " ".join(value.split())
    if not name:
        raise InvalidInput(f"{field}: must not be empty")
    if len(name) > max_chars:
        raise InvalidInput(f"{field}: at most {max_chars} characters (this one has {len(name)})")
    return name


def update_conversation(conversation: Conversation, changes: dict) -> None:
    """Rename and/or pin a conversation (`changes`: a PATCH body, `{"title": str, "pinned": bool}`, either or
    both). Neither counts as activity: `updated_at` is kept, so renaming or pinning does not reorder the list
    by recency. Raises InvalidInput naming the field at fault; nothing is changed then."""
    unknown = sorted(set(changes) - {"title", "pinned"})
    if unknown:
        raise InvalidInput(f"{unknown[0]}: unknown field (a conversation's title and pinned can be changed)")
    if not changes:
        raise InvalidInput("title or pinned: nothing to change")
    fields = {}
    if "title" in changes:
        fields["title"] = one_line(changes["title"], "title", TITLE_MAX_CHARS)
    if "pinned" in changes:
        if not isinstance(changes["pinned"], bool):
            raise InvalidInput("pinned: must be true or false")
        fields["pinned"] = changes["pinned"]
    Conversation.objects.filter(id=conversation.id).update(**fields)
    for name, value in fields.items():
        setattr(conversation, name, value)


@dataclass(frozen=True)
class Reply:
    """A finished request's reply to store: `done` holds its `gen.done` outputs, usage and timing; `parent_id` is
    the message it answers (None: the conversation's leaf when it is stored)."""

    conversation_id: UUID
    request_id: str
    done: dict
    worker: str
    parent_id: int | None = None


def save_reply(conversation_id: UUID, request_id: str, done: dict, worker: str, parent_id: int | None = None) -> Message:
    """One reply (`save_replies`); raises Conversation.DoesNotExist when its conversation is gone."""
    message = save_replies([Reply(conversation_id, request_id, done, worker, parent_id)])[0]
    if message is None:
        raise Conversation.DoesNotExist(f"conversation {conversation_id} not found")
    return message


def save_replies(replies: list[Reply]) -> list[Message | None]:
    """Add the assistant replies of finished requests, each under its `parent_id`, show their branches and
    remember which worker holds each conversation's prefix: in one transaction of four queries however many
    replies to distinct conversations there are (a burst of chats ends in one engine step, and their replies written
    one transaction each queued on the one database thread, ~3 ms apiece). Replies to one conversation are added
    in order, each under the one before when it names no parent, its leaf becoming the last. A reply whose
    conversation is gone (deleted meanwhile) gives None; the others are stored."""
    with transaction.atomic():
        conversations = Conversation.objects.select_for_update().in_bulk({r.conversation_id for r in replies})
        wanted = {r.parent_id for r in replies} | {c.leaf_id for c in conversations.values()}
        parents = Message.objects.in_bulk(wanted - {None})
        leaves = {c.id: parents.get(c.leaf_id) for c in conversations.values()}
        messages: list[Message | None] = []
        pending: list[Message] = []  # built, not inserted yet
        for reply in replies:
            conversation = conversations.get(reply.conversation_id)
            if conversation is None:
                messages.append(None)
                continue
            parent = parents.get(reply.parent_id) if reply.parent_id else leaves[conversation.id]
            if parent is not None and parent.conversation_id != conversation.id:
                parent = None  # a message of another conversation is no parent
            if parent is not None and parent.pk is None:  # a reply of this batch: insert it before its child
                Message.objects.bulk_create(pending)
                pending = []
            outputs = sorted(reply.done["outputs"], key=lambda o: o["index"])
            message = Message(
                conversation=conversation,
                parent=parent,
                position=parent.position + 1 if parent else 0,
                role=Message.Role.ASSISTANT,
                content=outputs[0]["text"] if outputs else "",
                samples=[o["text"] for o in outputs] if len(outputs) > 1 else None,
                finish_reason=(outputs[0]["finish_reason"] or "") if outputs else "",
                usage=reply.done.get("usage"),
                timing=reply.done.get("timing"),
                request_id=reply.request_id,
                worker=reply.worker,
            )
            messages.append(message)
            pending.append(message)
            leaves[conversation.id] = message
            conversation.last_worker = reply.worker
        Message.objects.bulk_create(pending)
        now = timezone.now()
        touched = {conversations[r.conversation_id] for r, m in zip(replies, messages) if m is not None}
        for conversation in touched:
            conversation.leaf = leaves[conversation.id]
            conversation.updated_at = now
        _update_conversations(touched, ["leaf", "last_worker", "updated_at"])
    return messages


def _update_conversations(conversations: Iterable[Conversation], names: list[str]) -> None:
    """Write the fields `names` of each conversation: one UPDATE statement run per row (`executemany`). Every
    `done` of a burst waits for its batch, and Django's bulk_update, a CASE WHEN per row and field, took ~35 ms
    of the database thread's CPU for 64 conversations against ~2 here (an ORM update per row: ~15)."""
    meta, quote = Conversation._meta, connection.ops.quote_name
    fields = [meta.get_field(name) for name in names]
    sql = (f"UPDATE {quote(meta.db_table)} SET {', '.join(f'{quote(f.column)} = %s' for f in fields)} "
           f"WHERE {quote(meta.pk.column)} = %s")
    rows = [[f.get_db_prep_save(getattr(c, f.attname), connection) for f in fields]
            + [meta.pk.get_db_prep_value(c.pk, connection)] for c in conversations]
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(sql, rows)


def active_path(conversation: Conversation) -> list[Message]:
    """The shown branch: the messages from the root to the conversation's leaf."""
    by_id = {m.id: m for m in conversation.messages.all()}
    path = []
    node = by_id.get(conversation.leaf_id)
    while node is not None:
        path.append(node)
        node = by_id.get(node.parent_id)
    return path[::-1]


def show_branch(conversation: Conversation, message_id: int) -> None:
    """Show the branch through `message_id`: down from it, the latest reply or follow-up at every step."""
    message = conversation.messages.filter(id=message_id).first()
    if message is None:
        raise ConversationNotFound(f"message {message_id} not found")
    while (child := message.children.order_by("-id").first()) is not None:
        message = child
    conversation.leaf = message
    conversation.save(update_fields=["leaf", "updated_at"])


def delete_message(conversation: Conversation, message_id: int) -> None:
    """Delete a message and everything after it on its branches. The branch shown moves to its latest sibling,
    or, without one, ends at its parent."""
    with transaction.atomic():
        message = conversation.messages.filter(id=message_id).first()
        if message is None:
            raise ConversationNotFound(f"message {message_id} not found")
        siblings = conversation.messages.filter(parent_id=message.parent_id).exclude(id=message.id).order_by("-id")
        shown = {m.id for m in active_path(conversation)}
        message.delete()
        if message_id in shown:
            sibling = siblings.first()
            if sibling is not None:
                show_branch(conversation, sibling.id)
            else:
                conversation.leaf_id = message.parent_id
                conversation.save(update_fields=["leaf", "updated_at"])


def conversation_detail(conversation: Conversation) -> dict:
    """The JSON shape of one conversation (docs/protocol.md): the shown branch, each message with its id and
    its siblings (the branches at that point, oldest first) so the page can step between them."""
    path = active_path(conversation)
    siblings: dict[int | None, list[int]] = {}
    for message_id, parent_id in conversation.messages.order_by("id").values_list("id", "parent_id"):
        siblings.setdefault(parent_id, []).append(message_id)
    messages = [{"id": m.id, **m.as_dict(), "siblings": siblings[m.parent_id]} for m in path]
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    return {
        **conversation_summary(conversation),
        "system_prompt": system,
        "messages": messages,
    }


def conversation_summary(conversation: Conversation) -> dict:
    return {"id": str(conversation.id), "title": conversation.title, "pinned": conversation.pinned,
            "updated_at": conversation.updated_at.isoformat()}
