"""How many tasks wait in each Celery queue, the shared `gpu` one and each live worker's own: the signal to
scale workers on (`playground:queue_backlog` in /metrics). Read from the broker at each scrape."""
import logging

from kombu.exceptions import ChannelError, OperationalError

from playground.celery import app as celery_app

from ..shared import registry
from ..shared.naming import GPU_QUEUE

logger = logging.getLogger(__name__)


def queue_backlog() -> dict[str, int]:
    """{queue: waiting tasks}; a queue the broker has not seen yet holds none. Empty when the broker is down
    (the scrape still answers with the workers' figures)."""
    queues = [GPU_QUEUE, *sorted(w["queue"] for w in registry.live_workers() if w.get("queue"))]
    sizes: dict[str, int] = {}
    try:
        with celery_app.connection_for_read() as connection:
            channel = connection.default_channel
            for queue in queues:
                try:
                    sizes[queue] = channel.queue_declare(queue=queue, passive=True).message_count
                except ChannelError:  # never declared, or emptied and gone (Redis drops an empty list)
                    sizes[queue] = 0
    except (OperationalError, OSError):
        logger.warning("could not read the queue backlog from the broker", exc_info=True)
        return {}
    return sizes
