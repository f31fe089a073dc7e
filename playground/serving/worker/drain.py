"""A worker's graceful exit: on SIGTERM (a redeploy, `docker compose stop`) it drains instead of dying.

Celery's warm shutdown already stops taking tasks and waits for the running ones, but nobody else would know
the worker is leaving, and a stream longer than Docker's grace period would be cut silently. So, at once:
- the worker's registry entry says `draining` (rewritten now, not at the next heartbeat), so dispatch sends
  new work and sticky follow-ups to the shared queue, where another worker (or this one's successor) takes it;
- the requests it holds get `PLAYGROUND_DRAIN_S` seconds to finish;
- whatever is still running then is aborted and answered with a `gen.error` ("unavailable"), never a
  silent close; then Celery's shutdown completes and the process exits.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

POLL_S = 0.2


class Drain:
    """The drain of one worker runtime; `begin` is called from the signal handler and returns at once."""

    def __init__(self, seconds: float, serving: Callable[[], set[str]], abort: Callable[[str], None],
                 announce: Callable[[], object]) -> None:
        self.seconds = seconds
        self._serving = serving  # the ids of the requests the worker holds now
        self._abort = abort
        self._announce = announce  # rewrites the registry entry (which reads `started`)
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._cut: set[str] = set()

    def begin(self, seconds: float | None = None) -> None:
        """Start draining; `seconds`, when given, replaces the worker's drain time (the embedded server gives 0:
        its shutdown has closed every client)."""
        if self.started.is_set():
            return
        if seconds is not None:
            self.seconds = seconds  # also what the cut requests' error says they had
        self.started.set()
        threading.Thread(target=self._run, name="worker-drain", daemon=True).start()

    def was_cut(self, request_id: str) -> bool:
        """Whether the drain aborted this request (its end must then be an error, not a short reply)."""
        with self._lock:
            return request_id in self._cut

    def _run(self) -> None:
        try:
            self._announce()
        except Exception:
            logger.exception("drain: could not mark this worker draining in the registry")
        held = self._serving()
        logger.info("drain: %d request(s) in flight, %s s to finish", len(held), self.seconds)
        deadline = time.monotonic() + self.seconds
        while held and time.monotonic() < deadline:
            time.sleep(POLL_S)
            held = self._serving()
        if not held:
            logger.info("drain: every request finished")
            return
        logger.warning("drain: cutting %d request(s) still running after %s s: %s", len(held), self.seconds,
                       ", ".join(sorted(held)))
        with self._lock:
            self._cut |= held
        for request_id in held:
            self._abort(request_id)
