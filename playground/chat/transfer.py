"""Export and import of conversations (docs/protocol.md, "Export and import").

JSON export keeps the whole message tree, every branch included, in a versioned format:

    {"format": "paged-playground.conversations", "version": 1, "exported_at": "<ISO 8601>",
     "conversations": [{"title": str, "pinned": bool, "created_at": "<ISO 8601>", "updated_at": "<ISO 8601>",
                        "leaf": <message id> | null,
                        "messages": [{"id": int, "parent": <message id> | null, "role": "system"|"user"|"assistant",
                                      "content": str, "samples": [str...] | null, "finish_reason": str | null,
                                      "usage": {...} | null, "timing": {...} | null}...]}...]}

Message ids are local to the file (0, 1, 2... in the order written); a message's parent comes before it, so the
tree is acyclic by construction and an importer can build it in one pass. `leaf` is the last message of the
branch shown. Markdown export is for reading: the branch shown, one section per message.

Import validates the whole file before writing anything (every refusal names the field by its path), then
writes every conversation in one transaction, owned by the importing user (or anonymous session) only.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from playground.serving.web.edge import InvalidInput

from .models import TITLE_MAX_CHARS, Conversation, Message
from .store import active_path, owner_fields

FORMAT = "paged-playground.conversations"
VERSION = 1
MAX_IMPORT_BYTES = 16 * 1024 * 1024
MAX_CONVERSATIONS = 1000
MAX_MESSAGES = 5000  # per conversation
MAX_CONTENT_CHARS = 200_000  # per message text (a reply can be longer than what a user may type)
MAX_SAMPLES = 16
MAX_FINISH_REASON_CHARS = Message._meta.get_field("finish_reason").max_length

_CONVERSATION_FIELDS = {"title", "pinned", "created_at", "updated_at", "leaf", "messages"}
_MESSAGE_FIELDS = {"id", "parent", "role", "content", "samples", "finish_reason", "usage", "timing"}
_ROLES = set(Message.Role.values)


# ---------------------------------------------------------------- export

def export_json(conversations: Iterable[Conversation]) -> dict[str, Any]:
    """The documented JSON document of `conversations` (two queries: the conversations, then their messages)."""
    conversations = list(conversations)
    by_conversation: dict[Any, list[Message]] = {c.id: [] for c in conversations}
    for message in Message.objects.filter(conversation__in=conversations).order_by("id"):
        by_conversation[message.conversation_id].append(message)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": timezone.now().isoformat(),
        "conversations": [_conversation_json(c, by_conversation[c.id]) for c in conversations],
    }


def _conversation_json(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    local = {message.id: i for i, message in enumerate(messages)}  # ids ascend, so parents come first
    return {
        "title": conversation.title,
        "pinned": conversation.pinned,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "leaf": local.get(conversation.leaf_id),
        "messages": [
            {"id": local[m.id], "parent": local.get(m.parent_id), **m.as_dict()} for m in messages
        ],
    }


def export_markdown(conversations: Iterable[Conversation]) -> str:
    """The branch shown of each conversation, readable as Markdown."""
    return "\n\n---\n\n".join(_conversation_markdown(c) for c in conversations) + "\n"


def _conversation_markdown(conversation: Conversation) -> str:
    parts = [f"# {conversation.title or 'Untitled'}", f"*{conversation.updated_at:%Y-%m-%d %H:%M} UTC*"]
    for message in active_path(conversation):
        parts.append(f"## {message.role.capitalize()}\n\n{message.content}")
    return "\n\n".join(parts)


# ---------------------------------------------------------------- import

def validate(document: Any) -> list[dict[str, Any]]:
    """The conversations of an import `document` (parsed JSON), checked against the format above; raises
    InvalidInput naming the first field at fault."""
    _require_object(document, "the file", {"format", "version", "exported_at", "conversations"})
    if document.get("format") != FORMAT:
        raise InvalidInput(f'format: must be "{FORMAT}" (a file exported from this chat)')
    version = document.get("version")
    if type(version) is not int or version != VERSION:
        raise InvalidInput(f"version: {version!r} is not supported; this server reads version {VERSION}")
    conversations = document.get("conversations")
    if not isinstance(conversations, list):
        raise InvalidInput("conversations: must be a list")
    if len(conversations) > MAX_CONVERSATIONS:
        raise InvalidInput(f"conversations: at most {MAX_CONVERSATIONS} in one file")
    for i, conversation in enumerate(conversations):
        _validate_conversation(conversation, f"conversations[{i}]")
    return conversations


def _validate_conversation(conversation: Any, path: str) -> None:
    _require_object(conversation, path, _CONVERSATION_FIELDS)
    for name in ("title", "messages"):
        if name not in conversation:
            raise InvalidInput(f"{path}.{name}: missing")
    _check_str(conversation["title"], f"{path}.title", TITLE_MAX_CHARS)
    if not isinstance(conversation.get("pinned", False), bool):
        raise InvalidInput(f"{path}.pinned: must be true or false")
    for name in ("created_at", "updated_at"):
        if name in conversation:
            _parse_time(conversation[name], f"{path}.{name}")
    messages = conversation["messages"]
    if not isinstance(messages, list):
        raise InvalidInput(f"{path}.messages: must be a list")
    if len(messages) > MAX_MESSAGES:
        raise InvalidInput(f"{path}.messages: at most {MAX_MESSAGES} in one conversation")
    seen: set[int] = set()
    for j, message in enumerate(messages):
        where = f"{path}.messages[{j}]"
        _require_object(message, where, _MESSAGE_FIELDS)
        for name in ("id", "role", "content"):
            if name not in message:
                raise InvalidInput(f"{where}.{name}: missing")
        if type(message["id"]) is not int or message["id"] in seen:
            raise InvalidInput(f"{where}.id: must be an integer not used by another message of this conversation")
        parent = message.get("parent")
        if parent is not None and (type(parent) is not int or parent not in seen):
            raise InvalidInput(f"{where}.parent: must be null or the id of a message listed before this one")
        seen.add(message["id"])
        if message["role"] not in _ROLES:
            raise InvalidInput(f"{where}.role: must be one of {', '.join(sorted(_ROLES))}")
        _check_str(message["content"], f"{where}.content", MAX_CONTENT_CHARS)
        samples = message.get("samples")
        if samples is not None:
            if not isinstance(samples, list) or not 1 <= len(samples) <= MAX_SAMPLES:
                raise InvalidInput(f"{where}.samples: must be null or a list of 1 to {MAX_SAMPLES} texts")
            for k, sample in enumerate(samples):
                _check_str(sample, f"{where}.samples[{k}]", MAX_CONTENT_CHARS)
        if message.get("finish_reason") is not None:
            _check_str(message["finish_reason"], f"{where}.finish_reason", MAX_FINISH_REASON_CHARS)
        for name in ("usage", "timing"):
            if message.get(name) is not None and not isinstance(message[name], dict):
                raise InvalidInput(f"{where}.{name}: must be null or an object")
    leaf = conversation.get("leaf")
    if leaf is not None and (type(leaf) is not int or leaf not in seen):
        raise InvalidInput(f"{path}.leaf: must be null or the id of one of its messages")


def _require_object(value: Any, path: str, known: set[str]) -> None:
    if not isinstance(value, dict):
        raise InvalidInput(f"{path}: must be a JSON object")
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidInput(f"{path}.{unknown[0]}: unknown field")


def _check_str(value: Any, path: str, max_chars: int) -> None:
    if not isinstance(value, str):
        raise InvalidInput(f"{path}: must be a string")
    if len(value) > max_chars:
        raise InvalidInput(f"{path}: at most {max_chars} characters")


def _parse_time(value: Any, path: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{path}: must be an ISO 8601 date and time") from None
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


def import_conversations(document: Any, user, session_key: str) -> list[Conversation]:
    """Validate `document`, then create its conversations for this user (or anonymous session) only, all or
    none. Returns them, as created."""
    conversations = validate(document)
    created = []
    with transaction.atomic():
        for data in conversations:
            created.append(_create(data, owner_fields(user, session_key)))
    return created


def _create(data: dict[str, Any], owner: dict[str, Any]) -> Conversation:
    conversation = Conversation.objects.create(title=data["title"], pinned=data.get("pinned", False), **owner)
    depth: dict[int, int] = {}
    for m in data["messages"]:  # parents come first, so each depth is known when its children are reached
        depth[m["id"]] = depth[m["parent"]] + 1 if m.get("parent") is not None else 0
    made = Message.objects.bulk_create([
        Message(conversation=conversation, position=depth[m["id"]], role=m["role"], content=m["content"],
                samples=m.get("samples"), finish_reason=m.get("finish_reason") or "", usage=m.get("usage"),
                timing=m.get("timing"))
        for m in data["messages"]
    ])
    stored = {m["id"]: message for m, message in zip(data["messages"], made)}
    # The parents in a second statement: a row cannot point at one inserted in the same statement before it
    # has a primary key, and one insert per message would make a long transcript slow.
    children = []
    for m in data["messages"]:
        if m.get("parent") is not None:
            stored[m["id"]].parent = stored[m["parent"]]
            children.append(stored[m["id"]])
    Message.objects.bulk_update(children, ["parent"], batch_size=500)
    times = {name: _parse_time(data[name], name) for name in ("created_at", "updated_at") if name in data}
    leaf = stored.get(data.get("leaf"))
    # update(), not save(): save() would stamp updated_at with now and the list would lose the original order
    Conversation.objects.filter(id=conversation.id).update(leaf=leaf, **times)
    conversation.refresh_from_db()
    return conversation
