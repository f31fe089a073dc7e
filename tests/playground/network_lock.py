"""Keeps Docker's network changes away from the browser tests' page loads.

Chromium fails every connection it is opening with net::ERR_NETWORK_CHANGED when the host's network interfaces
change, loopback ones included, and Docker changes them: dockerd's start makes its bridge, a compose stack makes
a network and a veth pair per container, a restart or a teardown removes them. The compose smoke test runs
beside the browser tests (two xdist processes, and any other test run on this machine), and a chat page whose
module script failed so never opened its socket (CI of stop 56). A veth pair made and removed every 0.4 s failed
17 of 30 such page loads here, none without it.

So the machine holds one lock file: a browser holds it shared for its module's life, Docker work that changes
the interfaces holds it alone. A gate file makes a waiting Docker holder bar new browsers, so a run of browser
modules cannot starve it. The image builds use the host's network (docker_stack.build) and take no lock.
"""
from __future__ import annotations

import fcntl
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "paged-playground-network.lock"
GATE = LOCK.with_suffix(".gate")
WAIT_S = 2400  # far longer than the smoke test's stack holds it (77-150 s on a 2-core machine)


@contextmanager
def browsing() -> Iterator[None]:
    """Held by a browser: no Docker network change happens meanwhile."""
    with _held(fcntl.LOCK_SH):
        yield


@contextmanager
def changing_the_network() -> Iterator[None]:
    """Held by Docker work that adds or removes interfaces: no browser runs meanwhile."""
    with _held(fcntl.LOCK_EX):
        yield


@contextmanager
def _held(mode: int) -> Iterator[None]:
    with open(LOCK, "a") as lock:
        with open(GATE, "a") as gate:
            _acquire(gate, fcntl.LOCK_EX)
            try:
                _acquire(lock, mode)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _acquire(file, mode: int) -> None:
    """flock with a deadline: a holder that never lets go fails the waiting test by name instead of hanging
    the run."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            fcntl.flock(file, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{file.name} still held after {WAIT_S} s (network_lock.py)") from None
            time.sleep(0.25)
