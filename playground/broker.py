"""Celery's Redis broker transport with one Redis client per channel for its plain commands (CELERY_BROKER_TRANSPORT
in distributed mode).

kombu's Redis transport wraps its connection pool in a new redis-py client for every publish and for each of the
two pipelines that record and acknowledge every task a worker takes: ~74 us of CPU each (redis-py 8 registers
some 170 response callbacks per client), on the cores the engine computes on, for what is one round trip. redis-py's
clients are thread-safe (a command takes a connection from the pool and gives it back), so the channel keeps one
on its pool. The blocking reads (BRPOP, the fanout subscription) keep their own client, as kombu makes them.
"""
from __future__ import annotations

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client: redis.Redis | None = None

    def _create_client(self, asynchronous: bool = False) -> redis.Redis:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:  # a reconnection replaces the pool
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
