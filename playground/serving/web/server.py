"""daphne, configured once for every way the playground serves HTTP and websockets (`manage.py web`, and the
embedded `manage.py playground`).

Websocket frames: the consumers answer a frame over `max_frame_bytes` with an error frame (edge.py). Frames
far larger (over twice that) are refused by autobahn, before they are buffered, with a close frame 1009
("message too big") and its reason. autobahn's default, `failByDrop`, would instead drop the TCP connection
with no close frame at all: the client could not tell why. After that close frame the server reads the rest of
the refused frame and drops it, for up to CLOSE_HANDSHAKE_S, waiting for the client's close in reply. autobahn's
default of one second reset clients that were still uploading (10 MB on a loaded machine), and a client whose
send fails that way may lose the close frame it had already received.
"""
from collections.abc import Callable

from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server, twisted_loop
from django.conf import settings

from . import shutdown

CLOSE_HANDSHAKE_S = 10.0


def hard_frame_cap() -> int:
    """Bytes of the largest websocket message daphne accepts at all."""
    return settings.PLAYGROUND_LIMITS["max_frame_bytes"] * 2


class PlaygroundServer(Server):
    def run(self) -> None:
        """Serve until the reactor stops, then unwind the tasks it left (shutdown.end_leftover_tasks)."""
        super().run()
        shutdown.end_leftover_tasks(twisted_loop)


def build(host: str, port: int, on_ready: Callable[[], None], proxy_headers: bool = False) -> Server:
    """A daphne server for the playground's ASGI application; run it with `.run()` (blocks)."""
    from playground.asgi import application

    def ready() -> None:
        # The factory exists once run() is called and takes connections only after this returns.
        server.ws_factory.setProtocolOptions(failByDrop=False, closeHandshakeTimeout=CLOSE_HANDSHAKE_S)
        shutdown.close_websockets_on_shutdown(server)
        on_ready()

    server = PlaygroundServer(
        application,
        endpoints=build_endpoint_description_strings(host=host, port=port),
        ready_callable=ready,
        websocket_max_message_size=hard_frame_cap(),
        proxy_forwarded_address_header="X-Forwarded-For" if proxy_headers else None,
        proxy_forwarded_port_header="X-Forwarded-Port" if proxy_headers else None,
        proxy_forwarded_proto_header="X-Forwarded-Proto" if proxy_headers else None,
        verbosity=0,
    )
    return server
