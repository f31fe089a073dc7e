"""`manage.py web` on SIGTERM (serving/web/shutdown.py): every open websocket is closed with 1001 and the reason
"server restarting" (never a dropped TCP connection, 1006), and the process exits."""
import os
import signal
import subprocess
import sys
import time

import pytest
from live_stack import REPO, free_port, wait_for_http
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def test_sigterm_closes_every_socket_with_1001_and_a_reason(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL", "DEBUG"}}
    env.update(PLAYGROUND_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=120)
    with open(tmp_path / "web.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "web", "--port", str(port)], cwd=REPO, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/healthz", 60)
        sockets = [connect(f"ws://127.0.0.1:{port}/ws/chat/", origin=base, proxy=None) for _ in range(2)]
        process.send_signal(signal.SIGTERM)
        for ws in sockets:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None, "the connection dropped without a close frame"
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "server restarting")
        began = time.monotonic()
        process.wait(15)
        assert time.monotonic() - began < 15
    finally:
        if process.poll() is None:
            process.kill()
