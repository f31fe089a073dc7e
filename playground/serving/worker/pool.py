"""The GPU worker's Celery pool (`CELERY_WORKER_POOL`): Celery's threads pool, with every thread started when
the pool starts.

One process hosts one engine, and each task is a request waiting on the shared batch, so the pool is threads
(prefork would give each task its own engine). Celery's threads pool is a ThreadPoolExecutor, which starts a
thread for each task that finds none idle, and Celery's consumer waits for that start: with the engine holding
the interpreter, ~3.5 ms a task, so the first burst after a worker started (64 chats at once) reached the
engine over 0.2 s, one task after another (`python -m bench.serving`, a profile of the consumer's thread).
Started up front, a burst's tasks find their threads waiting.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from celery.concurrency.thread import TaskPool as ThreadsPool

START_TIMEOUT_S = 60.0  # the threads started with the pool wait this long for each other


class TaskPool(ThreadsPool):
    def on_start(self) -> None:
        super().on_start()
        started = threading.Barrier(self.limit)
        for _ in range(self.limit):  # each waits for the others, so none is idle when the next is submitted
            self.executor.submit(started.wait, START_TIMEOUT_S)

    def run_now(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the pool's threads, not through Celery's consumer (the embedded worker taking a
        generation itself, playground/serving/embedded.py); raises RuntimeError once the pool has stopped."""
        return self.executor.submit(fn, *args)
