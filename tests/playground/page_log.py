"""What a browser test's page saw, printed as it happens, so a failed test's captured output shows it: console
lines, requests that failed or answered an error, and each websocket's life. A page whose socket never opened
on a loaded CI machine left nothing else to go on."""
import sys
import time


def follow(page) -> None:
    """Print `page`'s console lines, failed requests and websocket events from now on."""
    page.on("console", lambda message: _say(f"console {message.type}: {message.text}"))
    page.on("requestfailed", lambda request: _say(f"request failed: {request.url} ({request.failure})"))
    page.on("response", _say_if_error)
    page.on("websocket", _follow_socket)


def _say_if_error(response) -> None:
    if response.status >= 400:
        _say(f"{response.status} {response.url}")


def _follow_socket(socket) -> None:
    _say(f"websocket {socket.url} opening")
    socket.on("socketerror", lambda error: _say(f"websocket {socket.url} error: {error}"))
    socket.on("close", lambda _: _say(f"websocket {socket.url} closed"))


def _say(line: str) -> None:
    print(f"{time.monotonic():.3f} {line}", file=sys.stderr)  # stdout is some tests' own (capsys)
