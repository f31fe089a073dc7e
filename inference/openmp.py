"""Run work that may use OpenMP on a thread that ends, so the calling thread keeps no OpenMP team.

Why: libgomp keeps a team of threads for each thread that has run a parallel region (any torch operation on a
large enough tensor), for as long as that thread lives. Once it manages more threads than there are CPUs, it cuts
every idle thread's spin to its throttled count (100 rounds, against GOMP_SPINCOUNT's 3,000 in a serving
process) and the engine's threads wait on the kernel to wake them at each of a forward's parallel regions: a
StreamingEngine built on its caller's thread, whose team stayed beside the loop thread's, stepped ~15% slower on
a 2-vCPU Xeon (docs/performance-notes.md). A thread that ends frees its team. Only the engine's loop thread
should keep one; model loading and adapter reading, which happen on other threads, go through `on_own_thread`.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def on_own_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on a short-lived thread, waited for; its result, or its exception raised here."""
    with ThreadPoolExecutor(1, thread_name_prefix="openmp-free") as worker:
        return worker.submit(fn, *args, **kwargs).result()
