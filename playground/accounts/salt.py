"""Per-user prefix-cache salt (vLLM's `cache_salt`), an operator setting.

Prefix caching across users is a timing side channel: a prompt another user sent recently comes back
faster, because its blocks are cached. With PLAYGROUND_CACHE_SALT=user, every user's block hashes are
salted with a secret derived from their identity, so users share cached blocks only with themselves.
"""
import hashlib
import hmac

from django.conf import settings

MODES = ("off", "user")


def cache_salt(who: str) -> str | None:
    """The salt for identity `who` (see limits.identity), or None when salting is off."""
    if settings.PLAYGROUND_CACHE_SALT == "off":
        return None
    return hmac.new(settings.SECRET_KEY.encode(), f"cache-salt:{who}".encode(), hashlib.sha256).hexdigest()[:32]
