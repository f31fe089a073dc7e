"""Per-user limits (concurrent requests, tokens per minute), their overrides, the cache salt, and how the
chat socket answers a user over a limit (an error event; the socket and the running request carry on)."""
import asyncio
import time

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.cache import cache
from fake_worker import connect, generate, until_end, worker

from playground.accounts import limits, salt
from playground.accounts.models import UserQuota

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrency_slots_are_taken_and_given_back():
    quota = limits.Quota(max_concurrent_requests=2, tokens_per_minute=0)
    first, second = limits.admit("user:1", quota), limits.admit("user:1", quota)
    with pytest.raises(limits.LimitExceeded, match="at most 2 at once"):
        limits.admit("user:1", quota)
    limits.admit("user:2", quota).release()  # someone else's slots are their own
    first.release()
    first.release()  # a second release gives nothing back twice
    third = limits.admit("user:1", quota)
    with pytest.raises(limits.LimitExceeded):
        limits.admit("user:1", quota)
    second.release(), third.release()


def test_tokens_per_minute_refuses_once_used_up():
    quota = limits.Quota(max_concurrent_requests=0, tokens_per_minute=10)
    admission = limits.admit("user:1", quota)
    admission.record(12)
    with pytest.raises(limits.LimitExceeded, match="10 tokens per minute") as refused:
        limits.admit("user:1", quota)
    assert 1 <= refused.value.retry_after <= 61
    limits.admit("user:2", quota)  # other users are unaffected


def test_the_window_slides_over_the_previous_minute():
    now = 1_000_000 * 60 + 15.0  # a quarter into a minute
    minute = int(now // 60)
    cache.set(f"limits:tpm:u:{minute - 1}", 100)
    cache.set(f"limits:tpm:u:{minute}", 10)
    assert limits.tokens_used("u", now) == pytest.approx(10 + 100 * 0.75)
    assert limits.tokens_used("u", now + 60) == pytest.approx(10 * 0.75)


def test_quota_overrides_apply_per_field(settings):
    settings.PLAYGROUND_USER_LIMITS = {"max_concurrent_requests": 4, "tokens_per_minute": 1000}
    alice = User.objects.create_user("alice")
    assert limits.quota_for(alice) == limits.Quota(4, 1000)
    UserQuota.objects.create(user=alice, tokens_per_minute=0)
    assert limits.quota_for(alice) == limits.Quota(4, 0)
    assert limits.quota_for(AnonymousUser()) == limits.Quota(4, 1000)
    assert limits.identity(alice) == f"user:{alice.pk}"
    assert limits.identity(AnonymousUser(), "abc") == "session:abc"


def test_cache_salt_is_per_user_and_off_by_default(settings):
    settings.PLAYGROUND_CACHE_SALT = "off"
    assert salt.cache_salt("user:1") is None
    settings.PLAYGROUND_CACHE_SALT = "user"
    one, two = salt.cache_salt("user:1"), salt.cache_salt("user:2")
    assert one == salt.cache_salt("user:1") and one != two and len(one) == 32
    settings.SECRET_KEY = "another secret"
    assert salt.cache_salt("user:1") != one  # not guessable from the identity alone


def anonymous_limits(settings, per_address: int, tokens_per_minute: int = 0, pool: int = 0) -> None:
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {"max_concurrent_requests_per_address": per_address,
                                            "tokens_per_minute_per_address": tokens_per_minute,
                                            "max_concurrent_requests": pool}


def test_socket_over_the_concurrency_limit_gets_an_error_event(monkeypatch, settings):
    anonymous_limits(settings, per_address=1)

    async def scenario():
        async with worker(monkeypatch, delay=0.02):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=40))
            started = await ws.receive_json_from(timeout=5)
            await ws.send_json_to(generate(max_tokens=4))
            frames = await until_end(ws)
            refused = next(f for f in frames if f["type"] == "error")
            rest = frames if frames[-1]["type"] == "done" else frames + await until_end(ws)
            # The slot comes back when the first request ends: the next one is served.
            await ws.send_json_to(generate(max_tokens=4))
            later = await until_end(ws)
            await ws.disconnect()
            return started, refused, rest[-1], later

    started, refused, first_done, later = asyncio.run(scenario())
    assert "request_id" not in refused and "too many concurrent requests" in refused["message"]
    assert first_done["type"] == "done" and first_done["request_id"] == started["request_id"]
    assert later[0]["type"] == "started" and later[-1]["type"] == "done"


def test_socket_over_tokens_per_minute_gets_an_error_event(monkeypatch, settings):
    anonymous_limits(settings, per_address=0, tokens_per_minute=5)

    async def scenario():
        async with worker(monkeypatch):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=4))
            first = await until_end(ws)
            await ws.send_json_to(generate(max_tokens=4))
            second = await ws.receive_json_from(timeout=5)
            await ws.disconnect()
            return first, second

    first, second = asyncio.run(scenario())
    assert first[-1]["type"] == "done"
    assert second["type"] == "error" and "tokens per minute" in second["message"]


def test_finished_and_refused_requests_give_their_slots_back(monkeypatch, settings):
    anonymous_limits(settings, per_address=1)

    async def scenario():
        async with worker(monkeypatch, delay=0.02):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=20))
            await ws.send_json_to(generate(max_tokens=2))  # refused: the first one holds the slot
            frames = await until_end(ws)
            frames += [] if frames[-1]["type"] == "done" else await until_end(ws)
            await ws.disconnect()
            return frames

    frames = asyncio.run(scenario())
    assert [f["type"] for f in frames if f["type"] != "token"] == ["started", "error", "done"]
    assert cache.get(f"limits:conc:{limits.anonymous_identity('')}") == 0


def test_a_turn_sent_the_moment_the_last_one_is_done_gets_the_slot(monkeypatch, settings):
    """The socket gives the slot back before it says `done`, so a client at its limit of one may send its next
    turn at once, every time, however slow giving it back is (a busy cache: here 0.2 s)."""
    anonymous_limits(settings, per_address=1)
    release = limits.Admission.release

    def slow_release(admission):
        time.sleep(0.2)
        release(admission)

    monkeypatch.setattr(limits.Admission, "release", slow_release)

    async def scenario():
        async with worker(monkeypatch):
            ws = await connect()
            turns = []
            for _ in range(3):
                await ws.send_json_to(generate(max_tokens=2))
                turns.append(await until_end(ws))
            await ws.disconnect()
            return turns

    for frames in asyncio.run(scenario()):
        assert frames[0]["type"] == "started" and frames[-1]["type"] == "done", frames[0]
