"""`manage.py web` on SIGTERM (serving/web/shutdown.py): every open websocket is closed with 1001 and the reason
"server restarting" (never a dropped TCP connection, 1006), and the process exits; the chat page in chromium
says "server restarting" and reconnects by itself once a new web process listens (static/common/restart.js).
Stopped with requests in flight, it unwinds what they left and still exits 0."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from live_stack import REPO, free_port, wait_for_http
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def start_web(workdir: Path, port: int) -> subprocess.Popen:
    """`manage.py web` on `port` over SQLite in `workdir` (migrated), once /healthz answers."""
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL", "DEBUG"}}
    env.update(PLAYGROUND_VAR_DIR=str(workdir), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=120)
    with open(workdir / f"web-{time.monotonic_ns()}.log", "wb") as log:  # the newest is the running one
        process = subprocess.Popen([sys.executable, "manage.py", "web", "--port", str(port)], cwd=REPO, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", 60)
    except TimeoutError:
        process.kill()
        raise
    return process


def test_sigterm_closes_every_socket_with_1001_and_a_reason(tmp_path):
    port = free_port()
    process = start_web(tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        with (connect(f"ws://127.0.0.1:{port}/ws/chat/", origin=base, proxy=None) as first,
              connect(f"ws://127.0.0.1:{port}/ws/chat/", origin=base, proxy=None) as second):
            process.send_signal(signal.SIGTERM)
            for ws in (first, second):
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=10)
                assert closed.value.rcvd is not None, "the connection dropped without a close frame"
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "server restarting")
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_sigterm_with_requests_in_flight_ends_their_tasks_and_exits_0(tmp_path):
    """daphne cancels each request's application, not the tasks Django's handler started for it; left pending,
    they crashed CPython at exit (SIGSEGV, -11) nearly every time a loaded web process was stopped."""
    port = free_port()
    process = start_web(tmp_path, port)
    stop = threading.Event()

    def browse() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
            except OSError:
                time.sleep(0.01)

    browsers = [threading.Thread(target=browse) for _ in range(12)]
    try:
        for browser in browsers:
            browser.start()
        time.sleep(1.5)
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        log = max(tmp_path.glob("web-*.log")).read_text()
        assert code == 0, log[-3000:]
        ended = re.search(r"ended (\d+) leftover task\(s\), 0 still pending", log)
        assert ended and int(ended[1]) > 0, "no request was in flight: the case was not exercised"
    finally:
        stop.set()
        for browser in browsers:
            browser.join()
        if process.poll() is None:
            process.kill()


# Every close the page's sockets see, so a missing banner says what the page got instead (the code, the reason).
RECORD_CLOSES = """
window.__closes = [];
window.WebSocket = class extends window.WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("close", (e) => window.__closes.push({code: e.code, reason: e.reason, clean: e.wasClean}));
  }
};
"""


@pytest.mark.browser
def test_the_page_says_server_restarting_and_reconnects_by_itself(tmp_path, page):
    port = free_port()
    process = start_web(tmp_path, port)
    page.add_init_script(RECORD_CLOSES)
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#conn[data-status=open]", timeout=30_000)
        page.evaluate("window.__samePage = true")
        process.send_signal(signal.SIGTERM)
        try:
            notice = page.wait_for_selector("#server-restarting", timeout=20_000)
        except PlaywrightTimeoutError:
            log = max(tmp_path.glob("web-*.log")).read_text()
            pytest.fail(f"no banner; the page's sockets closed with {page.evaluate('window.__closes')}, the web "
                        f"process {'exited ' + str(process.poll()) if process.poll() is not None else 'still runs'}"
                        f"; its log:\n{log[-3000:]}")
        assert "server restarting" in notice.text_content()
        assert process.wait(15) == 0
        process = start_web(tmp_path, port)  # the redeployed web, same address
        page.wait_for_selector("#server-restarting", state="detached", timeout=30_000)
        assert page.get_attribute("#conn", "data-status") == "open"
        assert page.evaluate("window.__samePage") is True  # reconnected in place, no reload
    finally:
        if process.poll() is None:
            process.kill()
