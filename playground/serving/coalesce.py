"""Coalescing of engine deltas into few channel-layer messages.

A fast engine emits a delta per sequence per step; sending each one would fill the channel's capacity,
past which Channels drops messages silently. Here the first text goes out at once, then at most one message
per `interval`, carrying everything that arrived meanwhile, per sample index, numbered by `seq`. Text never
waits longer than `interval` to be sent.

It runs in the thread that serves the request (a Celery task thread), reading the engine's blocking
stream, so no event loop is tied up waiting for tokens.
"""
import itertools
import queue
import time
from collections.abc import Callable
from typing import Any, Protocol


class Delta(Protocol):
    index: int
    text: str


class DeltaSource(Protocol):
    def get(self, timeout: float | None = None) -> Delta | None:
        """Next delta; None once the stream has ended; raises queue.Empty after `timeout` seconds."""


Chunk = dict[str, Any]  # {"index", "seq", "text"}


def pump(source: DeltaSource, send: Callable[[list[Chunk]], None], interval: float) -> int:
    """Forward the text of `source` through `send` until it ends; returns the number of chunks sent."""
    pending: dict[int, list[str]] = {}
    seq = itertools.count()
    last_send = float("-inf")

    def flush() -> None:
        nonlocal last_send
        if pending:
            send([{"index": i, "seq": next(seq), "text": "".join(parts)} for i, parts in sorted(pending.items())])
            pending.clear()
        last_send = time.monotonic()

    while True:
        timeout = max(0.0, last_send + interval - time.monotonic()) if pending else None
        try:
            delta = source.get(timeout=timeout)
        except queue.Empty:
            flush()
            continue
        if delta is None:
            flush()
            return next(seq)
        if delta.text:
            pending.setdefault(delta.index, []).append(delta.text)
        if pending and time.monotonic() - last_send >= interval:
            flush()
