"""Paged Playground's Django project.

Importing the Celery app here makes `celery -A playground worker` and Django share one configuration.

Every serving process imports this package before PyTorch, so the OpenMP setting below reaches PyTorch's
OpenMP runtime (libgomp), which reads it once, when it loads. A worker's engine shares its cores with the web
side (daphne, Channels, Celery's task threads, the token publisher). By default an OpenMP thread that runs out
of work spins for some 300,000 rounds (milliseconds) before it sleeps, holding a core the web side needs
between engine steps; sleeping at once (OMP_WAIT_POLICY=PASSIVE, this file's setting before) wakes both
threads through the kernel at each of a forward's hundreds of parallel regions, which made a decode step 20%
slower on an AMD EPYC (Zen 5). A short spin, GOMP_SPINCOUNT rounds (tens of microseconds), bridges the gaps
inside a forward and still sleeps between steps: the decode step as fast as spinning by default, and the
cores free for the web side (`python -m bench.serving`, BENCHMARKS.md). An operator's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT is kept (libgomp lets GOMP_SPINCOUNT override the policy, so none is set beside one).
"""
import os

SPIN_COUNT = "3000"

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)

from .celery import app as celery_app  # noqa: E402 (after the setting above, which must precede torch)

__all__ = ("celery_app",)
