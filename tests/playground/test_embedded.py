"""`python manage.py playground`: one process, no Redis, no Docker; the same Celery -> engine -> channel
layer -> websocket path, with in-memory transports and the real model."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from live_stack import ENGINE_ENV, REPO, free_port
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def test_embedded_command_serves_a_streamed_chat(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(ENGINE_ENV, PLAYGROUND_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "embedded.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "playground", "--port", str(port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.3)
            log.seek(0)
            url = re.search(r"running at (http://\S+)", log.read())
        assert url and url.group(1) == f"http://127.0.0.1:{port}/", "no URL printed"
        assert (tmp_path / "playground.sqlite3").exists()  # migrated on its own

        with connect(f"ws://127.0.0.1:{port}/ws/chat/", origin=f"http://127.0.0.1:{port}", proxy=None) as ws:
            ws.send(json.dumps({"type": "generate", "messages": [{"role": "user", "content": "Say hello."}],
                                "params": {"temperature": 0, "max_tokens": 4}}))  # fmt: skip
            frames = []
            while not frames or frames[-1]["type"] not in ("done", "error"):
                frames.append(json.loads(ws.recv(timeout=300)))
        done = frames[-1]
        assert done["type"] == "done", done
        streamed = "".join(f["text"] for f in frames if f["type"] == "token")
        assert streamed == done["outputs"][0]["text"] and done["usage"]["completion_tokens"] >= 1
        assert done["worker"].startswith("embedded@")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("the embedded server did not stop on SIGTERM")
