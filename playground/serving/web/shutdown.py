"""The web process's SIGTERM (a redeploy, `docker compose stop`): every open websocket gets a close frame 1001
("going away") with the reason "server restarting" before the reactor stops, so a page can tell a restart from
a network failure, say so and reconnect by itself (static/common/restart.js). Without this, twisted's shutdown
drops the TCP connections and the page sees 1006, no reason.

Once the reactor has stopped, the asyncio tasks still pending are cancelled and unwound (`end_leftover_tasks`),
so the process exits 0 even when it stopped with requests in flight."""
import asyncio
import logging

from autobahn.websocket.protocol import WebSocketProtocol
from daphne.server import Server
from twisted.internet import defer, reactor, task

logger = logging.getLogger(__name__)

CLOSE_CODE = 1001
CLOSE_REASON = "server restarting"
FLUSH_S = 0.5  # the close frames get this long to leave before the reactor stops
UNWIND_S = 5.0  # the leftover tasks get this long to unwind after the reactor stopped


def close_websockets_on_shutdown(server: Server) -> None:
    """Call once the reactor runs (daphne's ready callback)."""
    reactor.addSystemEventTrigger("before", "shutdown", close_websockets, server)


def close_websockets(server: Server) -> defer.Deferred:
    sockets = [protocol for protocol in list(server.connections)
               if isinstance(protocol, WebSocketProtocol) and protocol.state == WebSocketProtocol.STATE_OPEN]
    for protocol in sockets:
        # sendCloseFrame: autobahn's sendClose takes only the application's codes (1000, 3000-4999).
        protocol.sendCloseFrame(code=CLOSE_CODE, reasonUtf8=CLOSE_REASON.encode())
    logger.info("shutting down: closed %d websocket(s) with %d (%s)", len(sockets), CLOSE_CODE, CLOSE_REASON)
    return task.deferLater(reactor, FLUSH_S if sockets else 0, lambda: None)


def end_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on `loop` (the reactor's, stopped) and let them unwind, as asyncio.run does.

    daphne cancels each connection's application on shutdown, but not the tasks an application started: Django's
    ASGI handler, cancelled while a request is in flight, leaves its listen_for_disconnect and process_request
    tasks pending. Python would then close those coroutines while it tears its modules down at exit, and CPython
    3.11 crashes there (SIGSEGV formatting an error in asyncio.Queue.get's clean-up): the process of a redeploy
    under load exited with -11 instead of 0.
    """
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for leftover in tasks:
        leftover.cancel()
    done, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=UNWIND_S))
    for ended in done:  # retrieved, so asyncio does not log them: a request cut short may end in any error
        if not ended.cancelled():
            ended.exception()
    logger.info("shutting down: ended %d leftover task(s), %d still pending", len(done), len(pending))
