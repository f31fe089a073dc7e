"""The API without a key (playground/api/auth.py, accounts/access.py): on the embedded default a client on this
machine is answered without one, under the anonymous limits, as vLLM's server without --api-key; from
another machine, or with PLAYGROUND_API_KEYLESS off (the default with REDIS_URL), a key is required. Over
the fake worker (tests/playground/fake_worker.py). The same against the real embedded server: test_api.py;
over Redis: test_api_distributed.py."""
import asyncio

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import AsyncClient
from fake_worker import worker

from playground.accounts import limits
from playground.accounts.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m-instruct"
LOCAL, REMOTE = "127.0.0.1", "203.0.113.9"


@pytest.fixture(autouse=True)
def keyless(settings):
    settings.PLAYGROUND_API_KEYLESS = True


class ClientAt(AsyncClient):
    """Django's async test client, connecting from `address` (its own is always 127.0.0.1)."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def _base_scope(self, **request):
        return {**super()._base_scope(**request), "client": [self.address, 40000]}


def request(path: str, key: str | None = None, address: str = LOCAL, body: dict | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    client = ClientAt(address)
    if body is None:
        return client.get(path, headers=headers)
    return client.post(path, body, content_type="application/json", headers=headers)


def test_the_seeds_example_4_shape_is_answered_without_a_key(monkeypatch):
    """`requests.post(".../v1/completions", json={"model", "prompt", "max_tokens"})`: no Authorization at all."""

    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            response = await request("/v1/completions", body={"model": MODEL, "prompt": "Hello", "max_tokens": 5})
            return response, submitted

    response, submitted = asyncio.run(scenario())
    assert response.status_code == 200, response.content
    completion = response.json()
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]
    assert 1 <= completion["usage"]["completion_tokens"] <= 5
    assert len(submitted) == 1
    assert not cache.get(f"limits:conc:{limits.anonymous_identity(LOCAL)}")  # its anonymous slot was given back


def test_a_keyless_caller_counts_against_the_anonymous_limits_and_a_key_still_names_its_user(monkeypatch, settings):
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {**settings.PLAYGROUND_ANONYMOUS_LIMITS, "tokens_per_minute_per_address": 5}
    limits.Admission(limits.anonymous_identity(LOCAL), []).record(10)  # this address used its minute's tokens
    _, secret = ApiKey.objects.issue(User.objects.create(username="keyed"))
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3}

    async def scenario():
        async with worker(monkeypatch):
            anonymous = await request("/v1/completions", body=body)
            keyed = await request("/v1/completions", key=secret, body=body)
            return anonymous, keyed

    anonymous, keyed = asyncio.run(scenario())
    assert anonymous.status_code == 429 and "tokens per minute" in anonymous.json()["error"]["message"]
    assert keyed.status_code == 200  # the user's own limits, not the address's
    assert ApiKey.objects.get(user__username="keyed").last_used_at is not None


@pytest.mark.parametrize("keyless, address, key, status", [
    (True, LOCAL, None, 200),
    (True, "::1", None, 200),
    (True, LOCAL, "EMPTY", 200),  # the placeholder vLLM's clients send: ignored, as vLLM does
    (True, REMOTE, None, 401),  # another machine: a key, always
    (True, REMOTE, "EMPTY", 401),
    (False, LOCAL, None, 401),  # PLAYGROUND_API_KEYLESS off (the default with REDIS_URL)
    (False, LOCAL, "EMPTY", 401),
])
def test_who_needs_a_key(settings, keyless, address, key, status):
    settings.PLAYGROUND_API_KEYLESS = keyless
    response = asyncio.run(request("/v1/models", key=key, address=address))
    assert response.status_code == status, response.content
    if status == 401:
        assert response.json()["error"]["code"] == "invalid_api_key"
    _, secret = ApiKey.objects.issue(User.objects.create(username=f"user-{keyless}-{status}-{len(address)}"))
    assert asyncio.run(request("/v1/models", key=secret, address=address)).status_code == 200  # a key always works
