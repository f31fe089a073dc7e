"""Conversations and their messages, owned by a user or, for anonymous use, by a session.

A conversation's messages form a tree: editing a message or regenerating a reply adds a sibling beside the
old one (a branch) instead of replacing it, as chat apps keep them. `Conversation.leaf` is the last message of
the branch on screen; the transcript is the path from the root to it (store.active_path).
"""
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q, QuerySet


TITLE_MAX_CHARS = 200


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user, session_key: str | None) -> "QuerySet[Conversation]":
        """Conversations visible to this user (or to this anonymous session)."""
        if user is not None and user.is_authenticated:
            return self.filter(user=user)
        if not session_key:
            return self.none()
        return self.filter(user__isnull=True, session_key=session_key)


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

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-pinned", "-updated_at", "-id"]  # the sidebar's order; listing.py pages through it
        indexes = [models.Index(fields=["user", "-pinned", "-updated_at", "-id"], name="conversation_list_order")]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False) | ~Q(session_key=""), name="conversation_has_owner"
            )
        ]

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
