"""Which GPU workers are alive, from heartbeats kept in Django's cache (Redis when distributed).

A worker rewrites its entry every `PLAYGROUND_HEARTBEAT_INTERVAL` seconds with a time-to-live of
`PLAYGROUND_HEARTBEAT_TTL`, so a killed worker vanishes within that TTL: consumers use this to fail a
request whose worker died, routing uses it to pick a live worker, and /healthz reports it.
"""
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache

_PREFIX = "playground:worker:"
_INDEX = "playground:workers"
_INDEX_TTL = 24 * 3600


def _key(name: str) -> str:
    return _PREFIX + name


def beat(info: dict[str, Any]) -> None:
    """Publish a worker's heartbeat: `info` must hold at least `name`."""
    name = info["name"]
    cache.set(_key(name), {**info, "time": time.time()}, timeout=settings.PLAYGROUND_HEARTBEAT_TTL)
    names = set(cache.get(_INDEX) or ())
    if name not in names:
        cache.set(_INDEX, sorted(names | {name}), timeout=_INDEX_TTL)


def forget(name: str) -> None:
    """Remove a worker at clean shutdown, so nobody waits for its heartbeat to expire."""
    cache.delete(_key(name))


def get(name: str) -> dict[str, Any] | None:
    """The worker's last heartbeat, or None when it is gone."""
    return cache.get(_key(name)) if name else None


aget = sync_to_async(get, thread_sensitive=False)


def get_many(names: list[str]) -> dict[str, dict[str, Any]]:
    """The last heartbeats of the live ones among `names`, by name (one cache read for all)."""
    wanted = sorted({name for name in names if name})
    if not wanted:
        return {}
    entries = cache.get_many([_key(name) for name in wanted])
    return {name: entries[_key(name)] for name in wanted if _key(name) in entries}


def live_workers() -> list[dict[str, Any]]:
    """Heartbeats of all live workers; names whose heartbeat expired are pruned from the index."""
    names = list(cache.get(_INDEX) or ())
    entries = get_many(names)
    alive = [entries[n] for n in names if n in entries]
    if len(alive) != len(names):
        cache.set(_INDEX, sorted(w["name"] for w in alive), timeout=_INDEX_TTL)
    return alive


alive_workers = sync_to_async(live_workers, thread_sensitive=False)
