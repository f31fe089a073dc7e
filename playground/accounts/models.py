"""Per-user overrides of the server's usage limits (settings.PLAYGROUND_USER_LIMITS holds the defaults)."""
from django.conf import settings
from django.db import models


class UserQuota(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota")
    max_concurrent_requests = models.PositiveIntegerField(
        null=True, blank=True, help_text="generations running at once; empty = server default"
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="prompt + completion tokens per minute; 0 = unlimited, empty = server default"
    )

    def __str__(self) -> str:
        return f"quota of {self.user}"
