"""The in-process GPU worker of the embedded mode: a real Celery worker (threads pool) in a thread.

Requests still go Celery task -> engine -> channel layer -> websocket, exactly as with separate workers;
only the transports are in-memory. The worker sends through the web server's event loop, the one loop the
in-memory channel layer can serve.
"""
import asyncio
import socket
import threading

from django.conf import settings

from playground.celery import app as celery_app

from . import worker
from .naming import GPU_QUEUE, worker_queue


class EmbeddedWorker:
    def __init__(self, loop: asyncio.AbstractEventLoop, name: str | None = None) -> None:
        self.name = name or f"embedded@{socket.gethostname()}"
        worker.use_event_loop(loop)
        self._controller = celery_app.WorkController(
            hostname=self.name,
            pool="threads",
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
