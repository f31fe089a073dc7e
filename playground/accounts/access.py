"""Who may do what: the playground's access rules, in one place for every page, socket and the API.

- Using the playground (chat, demo watching, lab, the chat page's KV panel): anyone while anonymous use is
  allowed (`PLAYGROUND_ALLOW_ANONYMOUS`, on by default without REDIS_URL), else signed-in users.
- Presenting the demo (starting and stopping runs): anyone while anonymous use is allowed, else staff.
- The staff pages (memory view, recordings): active staff only, whatever the settings.
- The OpenAI-compatible API without a key: only from the machine itself (a loopback client address), and
  only while `PLAYGROUND_API_KEYLESS` is on (by default: no REDIS_URL and anonymous use allowed), which is
  what vLLM's server does without `--api-key`. Everywhere else the API needs a key (docs/security.md).
"""
import ipaddress

from django.conf import settings


def may_use_playground(user) -> bool:
    return settings.PLAYGROUND_ALLOW_ANONYMOUS or bool(user and user.is_authenticated)


def may_present(user) -> bool:
    return settings.PLAYGROUND_ALLOW_ANONYMOUS or bool(user and user.is_staff)


def is_staff(user) -> bool:
    return bool(user and user.is_active and user.is_staff)


def is_loopback(address: str) -> bool:
    """Whether a client address is this machine's own (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def may_call_api_without_key(client_address: str) -> bool:
    return settings.PLAYGROUND_API_KEYLESS and is_loopback(client_address)
