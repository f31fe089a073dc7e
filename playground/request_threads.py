"""Django's ASGI handler, with the thread each HTTP request runs its thread-sensitive work on kept for the next.

Django gives every request an executor of its own (asgiref's ThreadSensitiveContext): a new thread, started
by the request_started signal (its receivers, close_old_connections and reset_queries, are synchronous) and
joined by yet another thread after the response. Under load, with the engine's threads on every core, starting
those threads took ~6 ms of each streamed API request's time to first token (`python -m bench.request_timeline`:
daphne to the view 9-11 ms, 3-4 ms with the receivers gone). Here a finished request's executor waits, idle, for
the next request. One request still has its thread to itself, and the signals still run there, so that
thread's database connections are closed at each request's end as Django closes a WSGI worker thread's, unless
CONN_MAX_AGE keeps them (SQLite's, playground/envconfig.py: then the thread's next request reuses its connection).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler

IDLE_THREADS = 64  # at most this many wait between requests; a burst beyond it ends its extra threads


class PooledThreadsASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self._idle.pop() if self._idle else ThreadPoolExecutor(1, thread_name_prefix="request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            if len(self._idle) < IDLE_THREADS:
                self._idle.append(executor)
            else:
                executor.shutdown(wait=False)  # its thread ends after any call still queued
