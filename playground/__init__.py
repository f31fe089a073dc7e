"""Paged Playground's Django project.

Importing the Celery app here makes `celery -A playground worker` and Django share one configuration.

Every serving process imports this package before PyTorch, so the OpenMP setting below reaches PyTorch's
OpenMP runtime, which reads it once, when it loads: a worker's engine shares its cores with the web side
(daphne, Channels, Celery's task threads, the token publisher), and OpenMP threads that spin between parallel
regions, as they do by default, hold the cores that work needs. Sleeping instead made tokens delivered to 64
websocket chats 1.1x faster and halved their delay, with the bare engine no slower (`python -m bench.serving`,
BENCHMARKS.md). An operator's own OMP_WAIT_POLICY is kept.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .celery import app as celery_app  # noqa: E402 (after the setting above, which must precede torch)

__all__ = ("celery_app",)
