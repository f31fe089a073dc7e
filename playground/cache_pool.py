"""One Redis connection pool, and one client on it, per process for Django's cache, where Django would build a
pool per request and a client per cache call.

Django's cache handler is context-local: every request (an asyncio task, and the `sync_to_async` threads it calls)
gets a cache object of its own, and `RedisCache` gives each object its own connection pool. So each request that
touched the cache (the registry read for the API's sampling suggestions, the limits' counters) opened a Redis
connection, said HELLO and SELECT, and dropped it. Django takes the pool class as a cache option; this one hands
every cache object the process's pool for the same server and options (redis-py's pools are thread-safe, and
start afresh in a forked child). Django's client then wraps that pool in a new redis-py client for every call:
~74 us of CPU each (redis-py 8 registers some 170 response callbacks per client), twice what a GET's round trip
costs; `RedisCache` below reuses one client per pool (redis-py's clients are thread-safe, taking a connection
from the pool per command).
"""
from __future__ import annotations

import threading
from typing import Any

import redis
from django.core.cache.backends import redis as django_redis

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


_clients: dict[redis.ConnectionPool, redis.Redis] = {}


class SharedClientCacheClient(django_redis.RedisCacheClient):
    def get_client(self, key: str | None = None, *, write: bool = False) -> redis.Redis:
        """The process's client on the pool Django picked (made on first use)."""
        pool = self._get_connection_pool(write)
        client = _clients.get(pool)
        if client is None:
            with _lock:
                client = _clients.setdefault(pool, self._client(connection_pool=pool))
        return client


class RedisCache(django_redis.RedisCache):
    """Django's Redis cache backend on the process's shared clients (CACHES' BACKEND)."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedClientCacheClient
