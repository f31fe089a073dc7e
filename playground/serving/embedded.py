"""The embedded mode: daphne and a real Celery worker (its threads pool, in-process) in one process.

Requests still go Celery task -> engine -> channel layer -> websocket, exactly as with separate workers;
only the transports are in-memory. The worker sends through the web server's event loop, the one loop the
in-memory channel layer can serve.
"""
import asyncio
import socket
import threading
from collections.abc import Callable

from daphne.server import twisted_loop
from django.conf import settings

from playground.celery import app as celery_app

from .worker import runtime
from .shared.naming import GPU_QUEUE, worker_queue
from .web import server as web_server


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

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._controller.stop()
        self._thread.join(timeout=10)


def serve(host: str, port: int, on_ready: Callable[[], None]) -> None:
    """Serve the site and one GPU worker until the server stops (SIGINT/SIGTERM or `stop_serving`)."""
    embedded_worker = EmbeddedWorker(twisted_loop)
    server = web_server.build(host, port, on_ready)
    embedded_worker.start()
    try:
        server.run()
    finally:
        embedded_worker.stop()


def stop_serving() -> None:
    """Stop `serve` from any thread."""
    from twisted.internet import reactor

    reactor.callFromThread(reactor.stop)
