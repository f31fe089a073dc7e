"""Conversations and their messages, and the user's presets, owned by a user or, for anonymous use, by a session.

A conversation's messages form a tree: editing a message or regenerating a reply adds a sibling beside the
old one (a branch) instead of replacing it, as chat apps keep them. `Conversation.leaf` is the last message of
the branch on screen; the transcript is the path from the root to it (store.active_path).

Conversations and presets have one ownership rule (`OwnedQuerySet.owned_by`, `has_owner`, and
store.owner_fields for what a caller creates): a signed-in user's rows are theirs; an anonymous visitor's
belong to their session.
"""
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q, QuerySet
from django.db.models.functions import Lower


TITLE_MAX_CHARS = 200
PRESET_NAME_MAX_CHARS = 80


class OwnedQuerySet(models.QuerySet):
    def owned_by(self, user, session_key: str | None) -> QuerySet:
        """Rows visible to this user (or to this anonymous session)."""
        if user is not None and user.is_authenticated:
            return self.filter(user=user)
        if not session_key:
            return self.none()
        return self.filter(user__isnull=True, session_key=session_key)


def has_owner(name: str) -> models.CheckConstraint:
    """Every owned row has a user or, anonymous, a session."""
    return models.CheckConstraint(condition=Q(user__isnull=False) | ~Q(session_key=""), name=name)


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="conversations"
    )
    session_key = models.CharField(max_length=40, blank=True, db_index=True, help_text="owner when anonymous")
    title = models.CharField(max_length=TITLE_MAX_CHARS, blank=True)
    pinned = models.BooleanField(default=False, help_text="pinned conversations come first in the list")
    last_worker = models.CharField(
        max_length=255, blank=True, help_text="worker that served the last turn; its prefix cache holds the history"
    )
    leaf = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="last message of the branch shown; the transcript is the path from the root to it",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-pinned", "-updated_at", "-id"]  # the sidebar's order; listing.py pages through it
        indexes = [models.Index(fields=["user", "-pinned", "-updated_at", "-id"], name="conversation_list_order")]
        constraints = [has_owner("conversation_has_owner")]

    def __str__(self) -> str:
        return self.title or str(self.id)


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children",
        help_text="the message this one answers or follows; None for the first; siblings are branches",
    )
    position = models.PositiveIntegerField(help_text="depth in the tree: index in its transcript")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    samples = models.JSONField(null=True, blank=True, help_text="all n texts when the reply had n > 1")
    finish_reason = models.CharField(max_length=16, blank=True)
    usage = models.JSONField(null=True, blank=True)
    timing = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "position", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"

    def as_dict(self) -> dict:
        """The JSON shape documented in docs/protocol.md."""
        return {
            "role": self.role,
            "content": self.content,
            "samples": self.samples,
            "finish_reason": self.finish_reason or None,
            "usage": self.usage,
            "timing": self.timing,
        }


class Preset(models.Model):
    """A named system prompt and sampling settings (and model, where the page offers a choice) that its owner
    applies to the chat page's controls; playground/chat/presets.py checks what is stored."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="chat_presets"
    )
    session_key = models.CharField(max_length=40, blank=True, db_index=True, help_text="owner when anonymous")
    name = models.CharField(max_length=PRESET_NAME_MAX_CHARS)
    system_prompt = models.TextField(blank=True)
    params = models.JSONField(help_text="every sampling field, validated by the one table (serving/web/sampling.py)")
    model = models.CharField(max_length=255, blank=True, help_text="the model or adapter chosen; blank: none")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = [Lower("name"), "id"]  # the picker's order
        constraints = [
            has_owner("preset_has_owner"),
            models.UniqueConstraint(fields=["user", "name"], condition=Q(user__isnull=False),
                                    name="preset_name_unique_per_user"),
            models.UniqueConstraint(fields=["session_key", "name"], condition=Q(user__isnull=True),
                                    name="preset_name_unique_per_session"),
        ]

    def __str__(self) -> str:
        return self.name
