"""The sidebar's list of conversations, a page at a time, optionally searched.

Pages follow the model's order (pinned first, then the most recently updated, then the id as a tie-break) and
are cut by a keyset cursor, not an offset: the cursor names the last conversation shown (its `pinned`,
`updated_at` and `id`), and the next page is what sorts after it. So a conversation updated while the user
scrolls moves to the top instead of shifting every later page by one (no item is shown twice or skipped).

Search is a case-insensitive substring match over the title and the text of any message, on every branch: one
query with DISTINCT (a conversation whose messages match twice is listed once), which SQLite and PostgreSQL
both run as it is.
"""
import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from playground.serving.web.edge import InvalidInput

from .models import Conversation

PAGE_SIZE = 50
MAX_QUERY_CHARS = 200


@dataclass
class Page:
    conversations: list[Conversation]
    next_cursor: str | None  # None on the last page


def list_page(owned: QuerySet, query: str = "", cursor: str | None = None, size: int = PAGE_SIZE) -> Page:
    """One page of `owned` (the caller's conversations), those matching `query` when it is not blank, after
    `cursor` (the `next_cursor` of the page before; None for the first)."""
    conversations = owned.order_by("-pinned", "-updated_at", "-id")
    query = query.strip()
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"q: at most {MAX_QUERY_CHARS} characters")
    if query:
        conversations = conversations.filter(Q(title__icontains=query) | Q(messages__content__icontains=query))
        conversations = conversations.distinct()
    if cursor:
        pinned, updated_at, last_id = _decode(cursor)
        conversations = conversations.filter(
            Q(pinned__lt=pinned)
            | Q(pinned=pinned, updated_at__lt=updated_at)
            | Q(pinned=pinned, updated_at=updated_at, id__lt=last_id)
        )
    found = list(conversations[: size + 1])
    more = len(found) > size
    found = found[:size]
    return Page(found, _encode(found[-1]) if more else None)


def _encode(last: Conversation) -> str:
    raw = json.dumps([last.pinned, last.updated_at.isoformat(), str(last.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> tuple[bool, datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        pinned, updated_at, last_id = json.loads(raw)
        if not isinstance(pinned, bool):
            raise ValueError("pinned")
        return pinned, datetime.fromisoformat(updated_at), uuid.UUID(last_id)
    except (binascii.Error, ValueError, TypeError, AttributeError):
        raise InvalidInput("cursor: not a cursor this list gave out; start again without it") from None
