"""The GPU worker's Celery pool (playground/serving/worker/pool.py): every thread is started with the pool, so a
burst's tasks find their threads waiting instead of the consumer starting one per task."""
import threading
import time

import pytest
from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadsPool
from django.conf import settings

from playground.serving.worker.pool import TaskPool


def test_the_settings_pool_is_ours():
    assert get_implementation(settings.CELERY_WORKER_POOL) is TaskPool


def test_every_thread_is_started_with_the_pool_and_serves_tasks_after():
    ours, celerys = TaskPool(limit=8), ThreadsPool(limit=8)
    try:
        for pool in (ours, celerys):
            pool.start()
        assert ours.info["threads"] == 8 and celerys.info["threads"] == 0
        squares = []
        burst = [ours.apply_async(lambda k: k * k, (k,), callback=squares.append) for k in range(8)]
        for result in burst:
            result.wait(5)
        assert sorted(squares) == [k * k for k in range(8)] and ours.info["threads"] == 8
    finally:
        for pool in (ours, celerys):
            pool.stop()


def test_run_now_refuses_until_the_threads_start_is_queued_and_a_stop_is_prompt():
    """A generation the embedded worker took while the pool started its threads took one the start needed, and
    a pool stopped then waited out the start's timeout (an embedded playground hung 60 s on SIGTERM). Until
    every thread's start is queued the pool refuses, and the embedded worker leaves the task to Celery."""
    pool = TaskPool(limit=4)
    with pytest.raises(RuntimeError, match="still starting"):
        pool.run_now(time.sleep, 0)
    pool.start()
    release = threading.Event()
    running = pool.run_now(release.wait, 5)
    release.set()
    assert running.result(5) is True
    started = time.monotonic()
    pool.stop()
    assert time.monotonic() - started < 2
