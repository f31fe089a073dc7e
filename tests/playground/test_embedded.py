"""`python manage.py playground`: one process, no Redis, no Docker; the same task -> engine -> channel layer ->
websocket path (the in-process worker takes each generation onto its task threads itself), with in-memory
transports and the real model."""
import json

import pytest
from live_stack import EmbeddedServer
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def test_embedded_command_migrates_serves_a_streamed_chat_and_stops(tmp_path):
    server = EmbeddedServer(tmp_path)
    try:
        assert server.wait_url() == f"http://127.0.0.1:{server.port}/"
        assert (tmp_path / "playground.sqlite3").exists()  # migrated on its own
        with connect(server.ws_url, origin=server.base_url, proxy=None) as ws:
            ws.send(json.dumps({"type": "generate", "messages": [{"role": "user", "content": "Say hello."}],
                                "params": {"temperature": 0, "max_tokens": 4}}))
            frames = []
            while not frames or frames[-1]["type"] not in ("done", "error"):
                frames.append(json.loads(ws.recv(timeout=300)))
    finally:
        exit_code = server.stop()
    done = frames[-1]
    assert done["type"] == "done", done
    streamed = "".join(f["text"] for f in frames if f["type"] == "token")
    assert streamed == done["outputs"][0]["text"] and done["usage"]["completion_tokens"] >= 1
    assert done["worker"].startswith("embedded@")
    assert exit_code == 0
