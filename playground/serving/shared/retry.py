"""One more try for a channel-layer call that failed.

After a Redis restart every pooled connection of channels-redis is dead but still in its pool, and fails its
first use ("Connection closed by server"); the next call gets a fresh connection. So each send of the
workers, and each receive of a web process's inbox (web/inbox.py), is tried once more before the request is
failed.
A retried `gen.tokens` cannot duplicate text: the web side drops chunks whose `seq` it has already seen
(lifecycle.Collector).
"""
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def once_more(call: Callable[[], Awaitable[T]]) -> T:
    """`await call()`, and if it raises, once more (then the error propagates)."""
    try:
        return await call()
    except Exception as exc:
        logger.warning("channel-layer call failed (%s: %s); trying once more", type(exc).__name__, exc)
        return await call()
