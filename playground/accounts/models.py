"""What an account holds beyond Django's user: overrides of the server's usage limits (the defaults are in
settings.PLAYGROUND_USER_LIMITS) and API keys.

API keys are random secrets shown once at creation; only their SHA-256 is stored. Keys carry 256 bits of
randomness, so a plain (fast) hash is enough: nobody can brute-force it, and lookup by hash stays a single
indexed query per request.
"""
import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

KEY_PREFIX = "pp-"


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


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyManager(models.Manager):
    def issue(self, user, name: str = "") -> tuple["ApiKey", str]:
        """Create a key for `user`; returns the row and the secret (which is not stored: show it now)."""
        secret = new_secret()
        key = self.model(user=user, name=name)
        key.set_secret(secret)
        key.save()
        return key, secret

    def active_for(self, secret: str) -> "ApiKey | None":
        """The live key with this secret, with its user loaded; None for unknown, revoked or inactive."""
        return (
            self.select_related("user")
            .filter(key_hash=hash_key(secret), revoked=False, user__is_active=True)
            .first()
        )

    def use(self, secret: str) -> "ApiKey | None":
        """`active_for`, and the key's `last_used_at` stamped now (blocking: call it off the event loop)."""
        key = self.active_for(secret)
        if key is not None:
            self.filter(pk=key.pk).update(last_used_at=timezone.now())
        return key


class ApiKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, editable=False, help_text="first characters, to recognise the key")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyManager()

    class Meta:
        # The table the api app created, kept as it was: the model moved here, its rows did not (migration
        # accounts/0002_apikey changes Django's state only).
        db_table = "api_apikey"
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def set_secret(self, secret: str) -> None:
        self.prefix = secret[: len(KEY_PREFIX) + 6]
        self.key_hash = hash_key(secret)
