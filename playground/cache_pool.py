"""One Redis connection pool per process for Django's cache, where Django would build one per request.

Django's cache handler is context-local: every request (an asyncio task, and the `sync_to_async` threads it calls)
gets a cache object of its own, and `RedisCache` gives each object its own connection pool. So each request that
touched the cache (the registry read for the API's sampling suggestions, the limits' counters) opened a Redis
connection, said HELLO and SELECT, and dropped it. Django takes the pool class as a cache option; this one hands
every cache object the process's pool for the same server and options (redis-py's pools are thread-safe, and
start afresh in a forked child).
"""
from __future__ import annotations

import threading
from typing import Any

import redis

_lock = threading.Lock()
_pools: dict[tuple[str, tuple], redis.ConnectionPool] = {}


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> redis.ConnectionPool:
        """The pool for `url` and `kwargs`, made on first use and shared after."""
        key = (url, tuple(sorted((name, repr(value)) for name, value in kwargs.items())))
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = super().from_url(url, **kwargs)
            return pool
