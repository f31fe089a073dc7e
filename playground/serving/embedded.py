"""The embedded mode: daphne and a real Celery worker (its threads pool, in-process) in one process.

Requests go task -> engine -> channel layer -> websocket as with separate workers, the same task body on the
same pool's threads; the transports are in-memory, and the worker takes a generation onto its threads itself
(`EmbeddedWorker.take`, through shared/queueing.py) rather than through the broker and Celery's consumer. The
worker sends through the web server's event loop, the one loop the in-memory channel layer can serve.
"""
import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from daphne.server import twisted_loop
from django.conf import settings
from twisted.internet import reactor, threads  # daphne.server, imported first, installed the asyncio reactor

from playground.celery import app as celery_app

from .shared import queueing
from .shared.naming import GPU_QUEUE, worker_queue
from .web import server as web_server
from .worker import runtime, tasks
from .worker.pool import TaskPool

logger = logging.getLogger(__name__)


class EmbeddedWorker:
    def __init__(self, loop: asyncio.AbstractEventLoop, name: str | None = None) -> None:
        self.name = name or f"embedded@{socket.gethostname()}"
        runtime.use_event_loop(loop)
        self._controller = celery_app.WorkController(
            hostname=self.name,
            pool=settings.CELERY_WORKER_POOL,
            concurrency=settings.CELERY_WORKER_CONCURRENCY,
            queues=[GPU_QUEUE, worker_queue(self.name)],
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(target=self._controller.start, name="celery-worker", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()
        queueing.take_locally(self.take)

    def stop(self) -> None:
        """Stop taking work, cut what is still generating, and stop the worker (blocking; idempotent).

        Called while the server shuts down, its loop still running: the server's shutdown has closed every
        client, so the requests get no drain time, and their last events still go out through the loop.
        Stopped after the loop instead, each generation waited out its sends' timeouts (~12 s in all)."""
        if self._stopped:
            return
        self._stopped = True
        queueing.take_locally(None)
        if runtime.exists():
            runtime.current().drain.begin(seconds=0)
        self._controller.stop()
        self._thread.join(timeout=10)

    def take(self, request_id: str, task: dict[str, Any]) -> bool:
        """`run_on_pool` on this worker's Celery pool (None until the worker has started it)."""
        return run_on_pool(self._controller.pool, request_id, task)


def run_on_pool(pool: TaskPool | None, request_id: str, task: dict[str, Any]) -> bool:
    """Run the generation task's body on `pool`'s threads; False (Celery takes it) until the pool and the runtime
    exist and the pool has started its threads, once the pool has stopped, and while this worker passes new work
    on (draining beside another: the task body would hand it back here)."""
    if pool is None or not runtime.exists() or runtime.current().passes_on_new_work():
        return False
    try:
        running = pool.run_now(tasks.generate.run, request_id, task)
    except RuntimeError:  # the pool is still starting, or has shut down
        return False
    running.add_done_callback(lambda done: _log_failure(request_id, done))
    return True


def _log_failure(request_id: str, done: Future) -> None:
    """What Celery logs for a task that raised (the runtime answers the client itself)."""
    if not done.cancelled() and done.exception() is not None:
        logger.error("generation %s failed", request_id, exc_info=done.exception())


def serve(host: str, port: int, on_ready: Callable[[], None]) -> None:
    """Serve the site and one GPU worker until the server stops (SIGINT/SIGTERM or `stop_serving`)."""
    embedded_worker = EmbeddedWorker(twisted_loop)
    server = web_server.build(host, port, on_ready)
    embedded_worker.start()
    reactor.addSystemEventTrigger("before", "shutdown", threads.deferToThread, embedded_worker.stop)
    try:
        server.run()
    finally:
        embedded_worker.stop()  # when the server failed before its shutdown


def stop_serving() -> None:
    """Stop `serve` from any thread."""
    reactor.callFromThread(reactor.stop)
