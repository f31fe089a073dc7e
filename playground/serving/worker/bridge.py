"""One asyncio event loop per worker process, for all channel-layer traffic of its requests.

Worker threads hand coroutines to this loop instead of calling `async_to_sync` per message, and the token
publisher (coalesce.py) runs on it. In the embedded mode the loop is daphne's own, because the in-memory
channel layer only works inside one loop.
"""
import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Use `loop` when given (someone else runs it), else own a loop in a daemon thread once started."""
        self._loop = loop
        self._owns_loop = loop is None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("LoopBridge.start() has not been called")
        return self._loop

    def start(self) -> None:
        if not self._owns_loop or self._thread is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="channel-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (from a thread other than the loop's)."""
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self._owns_loop and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
