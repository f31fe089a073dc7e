"""Bearer-token authentication for the API (no cookies, so no CSRF exposure)."""
from asgiref.sync import sync_to_async
from django.http import HttpRequest
from django.utils import timezone

from .errors import ApiError
from .models import ApiKey


def _lookup(secret: str) -> ApiKey | None:
    key = ApiKey.objects.active_for(secret)
    if key is not None:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key


async def authenticate(request: HttpRequest) -> ApiKey:
    """The API key of `Authorization: Bearer <key>`; raises ApiError(401) when missing or not valid."""
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>' (see docs/api.md)",
                       code="invalid_api_key")  # fmt: skip
    key = await sync_to_async(_lookup, thread_sensitive=False)(secret.strip())
    if key is None:
        raise ApiError(401, "invalid API key", code="invalid_api_key")
    return key
