"""Who is calling the API: the user of a bearer key (no cookies, so no CSRF exposure), or, where the access
rules let a local client in without one (`accounts.access.may_call_api_without_key`), an anonymous caller
under the anonymous limits."""
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest

from playground.accounts import access, limits
from playground.accounts.models import ApiKey

from .errors import ApiError


@dataclass(frozen=True)
class Caller:
    user: Any | None  # the key's user; None for an anonymous local caller
    address: str  # the client address, which anonymous limits count against

    @property
    def identity(self) -> str:
        """Whose cache salt the request uses (accounts.salt)."""
        return limits.identity(self.user) if self.user is not None else limits.anonymous_identity(self.address)

    def admit(self) -> limits.Admission:
        """Take the caller's concurrency slot (blocking: reads the user's quota); raises LimitExceeded."""
        return limits.admit_user(self.user, address=self.address)


async def authenticate(request: HttpRequest) -> Caller:
    """The caller of `Authorization: Bearer <key>`; raises ApiError(401) when the key is missing or not valid,
    unless the caller may go without one: then a missing or unknown key (clients send placeholders such as
    "EMPTY", as vLLM's server without --api-key ignores them) makes an anonymous caller."""
    address = request.META.get("REMOTE_ADDR") or ""
    keyless = access.may_call_api_without_key(address)
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        if keyless:
            return Caller(None, address)
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' (see docs/api.md)",
                       code="invalid_api_key")
    key = await sync_to_async(ApiKey.objects.use, thread_sensitive=False)(secret.strip())
    if key is not None:
        return Caller(key.user, address)
    if keyless:
        return Caller(None, address)
    raise ApiError(401, "invalid API key", code="invalid_api_key")
