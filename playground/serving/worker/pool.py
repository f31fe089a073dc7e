"""The GPU worker's Celery pool (`CELERY_WORKER_POOL`): Celery's threads pool, with every thread started when
the pool starts.

One process hosts one engine, and each task is a request waiting on the shared batch, so the pool is threads
(prefork would give each task its own engine). Celery's threads pool is a ThreadPoolExecutor, which starts a
thread for each task that finds none idle, and Celery's consumer waits for that start: with the engine holding
the interpreter, ~3.5 ms a task, so the first burst after a worker started (64 chats at once) reached the
engine over 0.2 s, one task after another (`python -m bench.serving`, a profile of the consumer's thread).
Started up front, a burst's tasks find their threads waiting.

Nothing else may reach the threads while they start: a task submitted among the waits takes a thread the waits
needed, one wait is left queued behind it, and the other threads wait for it until the task ends or the start
times out. Stopped meanwhile, the pool cancelled the queued wait and its shutdown waited out the 60 s (an
embedded playground stopped under load hung so). `run_now` therefore refuses until every wait is queued.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from celery.concurrency.thread import TaskPool as ThreadsPool

START_TIMEOUT_S = 60.0  # the threads started with the pool wait this long for each other


class TaskPool(ThreadsPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open = threading.Event()  # every thread's start is queued: others may submit

    def on_start(self) -> None:
        super().on_start()
        started = threading.Barrier(self.limit)
        for _ in range(self.limit):  # each waits for the others, so none is idle when the next is submitted
            self.executor.submit(started.wait, START_TIMEOUT_S)
        self._open.set()

    def run_now(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the pool's threads, not through Celery's consumer (the embedded worker taking a
        generation itself, playground/serving/embedded.py); raises RuntimeError until the pool has started its
        threads and once it has stopped (Celery's consumer, which starts after the pool, takes the task then)."""
        if not self._open.is_set():
            raise RuntimeError("the pool is still starting its threads")
        return self.executor.submit(fn, *args)
