"""Per-user usage limits: concurrent generations and tokens per minute, shared by every web process.

Counters live in Django's cache (Redis in distributed mode), so all web processes see the same numbers.
`admit()` takes a concurrency slot or raises `LimitExceeded` (HTTP 429 / a websocket error event); the
caller gives the slot back with `Admission.release()` and reports the tokens the request used with
`Admission.record()`. Tokens per minute use a sliding window over two one-minute buckets: a request is
admitted while the estimate is under the limit, so one large request may overshoot once, then waits.
"""
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from playground.serving.web.edge import InvalidInput

ANONYMOUS_POOL_KEY = "limits:conc:anonymous-pool"
CONCURRENCY_TTL_S = 6 * 3600  # a slot leaked by a crashed process is reclaimed after this long
WINDOW_S = 60


class LimitExceeded(InvalidInput):
    """The user is over one of their limits; `retry_after` is a hint in seconds."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Quota:
    max_concurrent_requests: int  # 0 = unlimited
    tokens_per_minute: int  # 0 = unlimited


def quota_for(user) -> Quota:
    """The user's limits: their UserQuota fields where set, else the server defaults (anonymous too)."""
    defaults = settings.PLAYGROUND_USER_LIMITS
    concurrent, tpm = defaults["max_concurrent_requests"], defaults["tokens_per_minute"]
    if user is not None and user.is_authenticated:
        from .models import UserQuota

        override = UserQuota.objects.filter(user=user).first()
        if override is not None:
            concurrent = concurrent if override.max_concurrent_requests is None else override.max_concurrent_requests
            tpm = tpm if override.tokens_per_minute is None else override.tokens_per_minute
    return Quota(concurrent, tpm)


def identity(user, session_key: str = "") -> str:
    """Whose conversations and cache salt a request uses: the account, else the anonymous session."""
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return f"session:{session_key}"


def anonymous_identity(address: str) -> str:
    """Whose limits an anonymous request counts against: its client address, since a client without
    cookies gets a new session per socket and would otherwise escape every per-user limit."""
    return f"anon:{address or 'unknown'}"


def _incr(key: str, amount: int, timeout: int) -> int:
    cache.add(key, 0, timeout=timeout)
    try:
        return cache.incr(key, amount)
    except ValueError:  # expired between add and incr
        cache.set(key, amount, timeout=timeout)
        return amount


def tokens_used(who: str, now: float | None = None) -> float:
    """Tokens of the last minute, estimated from this minute's bucket and the overlapping part of the last."""
    now = time.time() if now is None else now
    minute = int(now // WINDOW_S)
    current, previous = (cache.get(f"limits:tpm:{who}:{m}", 0) for m in (minute, minute - 1))
    return current + previous * (1 - (now % WINDOW_S) / WINDOW_S)


class Admission:
    """The concurrency slots held by one request (its owner's, and the anonymous pool's for an anonymous
    request); release them exactly once (extra calls do nothing)."""

    def __init__(self, who: str, slot_keys: list[str]) -> None:
        self.who = who
        self._slot_keys = slot_keys

    def release(self) -> None:
        keys, self._slot_keys = self._slot_keys, []
        for key in keys:
            try:
                cache.decr(key)
            except ValueError:  # the counter expired meanwhile
                pass

    def record(self, tokens: int) -> None:
        """Count tokens (prompt + completion) against the tokens-per-minute limit."""
        if tokens > 0:
            _incr(f"limits:tpm:{self.who}:{int(time.time() // WINDOW_S)}", tokens, 2 * WINDOW_S)


def _take_slot(key: str, limit: int, refusal: str) -> None:
    if _incr(key, 1, CONCURRENCY_TTL_S) > limit:
        cache.decr(key)
        raise LimitExceeded(refusal)


def admit(who: str, quota: Quota, anonymous_pool: int = 0) -> Admission:
    """Let one request of `who` start, or raise LimitExceeded. `anonymous_pool` > 0: the request also takes
    a slot of the server-wide anonymous pool of that size."""
    if quota.tokens_per_minute:
        used = tokens_used(who)
        if used >= quota.tokens_per_minute:
            raise LimitExceeded(
                f"rate limit reached: {int(used)} of {quota.tokens_per_minute} tokens per minute used; "
                "try again shortly",
                retry_after=int(WINDOW_S - time.time() % WINDOW_S) + 1,
            )
    taken: list[str] = []
    try:
        if quota.max_concurrent_requests:
            _take_slot(f"limits:conc:{who}", quota.max_concurrent_requests,
                       f"too many concurrent requests: at most {quota.max_concurrent_requests} at once; "
                       "wait for one to finish")
            taken.append(f"limits:conc:{who}")
        if anonymous_pool:
            _take_slot(ANONYMOUS_POOL_KEY, anonymous_pool,
                       f"too many anonymous requests on this server ({anonymous_pool} at once); log in or "
                       "wait for one to finish")
            taken.append(ANONYMOUS_POOL_KEY)
    except BaseException:
        Admission(who, taken).release()
        raise
    return Admission(who, taken)


def admit_user(user, session_key: str = "", address: str = "") -> Admission:
    """`admit` for a chat-socket or API user (blocking: reads the user's quota from the database). An
    anonymous user is limited per client `address` and by the anonymous pool (PLAYGROUND_ANONYMOUS_LIMITS)."""
    if user is not None and user.is_authenticated:
        return admit(identity(user), quota_for(user))
    anonymous = settings.PLAYGROUND_ANONYMOUS_LIMITS
    quota = Quota(anonymous["max_concurrent_requests_per_address"], anonymous["tokens_per_minute_per_address"])
    return admit(anonymous_identity(address), quota, anonymous["max_concurrent_requests"])
