"""The web process's SIGTERM (a redeploy, `docker compose stop`): every open websocket gets a close frame 1001
("going away") with the reason "server restarting" before the reactor stops, so a page can tell a restart from
a network failure, say so and reconnect by itself (static/common/restart.js). Without this, twisted's shutdown
drops the TCP connections and the page sees 1006, no reason."""
import logging

from autobahn.websocket.protocol import WebSocketProtocol
from daphne.server import Server
from twisted.internet import defer, reactor, task

logger = logging.getLogger(__name__)

CLOSE_CODE = 1001
CLOSE_REASON = "server restarting"
FLUSH_S = 0.5  # the close frames get this long to leave before the reactor stops


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
