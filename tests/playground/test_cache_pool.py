"""The distributed settings' cache keeps one Redis connection pool and one client on it per process: requests reuse
connections instead of opening one each, and cache calls one client instead of building one each
(playground/cache_pool.py)."""
import os
import subprocess
import sys

import redis
from live_stack import REDIS_HOST, REDIS_PORT, REPO, empty_redis_db

from playground.cache_pool import SharedConnectionPool

# Twenty requests' worth of cache use, each in a context of its own as Django's ASGI handler runs a request (and
# its sync_to_async calls): the connections this process then holds to the database, and what it read back.
REQUESTS = """
import asyncio, os, django, redis
django.setup()
from asgiref.sync import sync_to_async
from django.core.cache import cache

async def request(number):
    await sync_to_async(cache.set, thread_sensitive=False)("k%d" % number, number)
    return await sync_to_async(cache.get, thread_sensitive=False)("k%d" % number)

async def main():
    made = []
    init = redis.Redis.__init__
    redis.Redis.__init__ = lambda self, *args, **kwargs: made.append(1) or init(self, *args, **kwargs)
    values = [await asyncio.create_task(request(n)) for n in range(20)]
    redis.Redis.__init__ = init
    probe = redis.Redis.from_url(os.environ["REDIS_URL"])
    db = probe.connection_pool.connection_kwargs["db"]
    # The server's every client is listed: other tests' stacks too, on other databases.
    others = [c for c in probe.client_list() if c["cmd"] != "client|list" and int(c["db"]) == db]
    print(values == list(range(20)), len(others), len(made))

asyncio.run(main())
"""


def test_requests_share_the_process_pool_instead_of_opening_a_connection_each():
    db = empty_redis_db()
    client = redis.Redis(REDIS_HOST, REDIS_PORT, db=db)
    try:
        env = {**os.environ, "REDIS_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}", "SECRET_KEY": "test-only",
               "DJANGO_SETTINGS_MODULE": "playground.settings"}
        out = subprocess.run([sys.executable, "-c", REQUESTS], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        read_back, connections, clients = out.stdout.split()
        assert read_back == "True"
        assert int(connections) <= 2  # Django alone: a pool and a connection per request, up to 20
        assert int(clients) <= 1  # Django alone: a redis-py client per cache call, 40
    finally:
        client.flushdb()


def test_one_pool_per_server_and_options():
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/3"
    pool = SharedConnectionPool.from_url(url)
    assert SharedConnectionPool.from_url(url) is pool
    assert SharedConnectionPool.from_url(f"redis://{REDIS_HOST}:{REDIS_PORT}/4") is not pool
    assert SharedConnectionPool.from_url(url, socket_timeout=5) is not pool
