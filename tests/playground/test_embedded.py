"""`python manage.py playground`: one process, no Redis, no Docker; the same task -> engine -> channel layer ->
websocket path (the in-process worker takes each generation onto its task threads itself), with in-memory
transports and the real model."""
import json
import signal
import time
from urllib.request import Request, urlopen

import pytest
from live_stack import FAKE_PLAYGROUND, EmbeddedServer
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


def test_stopped_mid_reply_it_cuts_the_generation_and_exits_at_once(tmp_path):
    """SIGTERM during a streamed API reply: the in-process worker cuts the generation while the server's loop
    still runs, so the client reads why, and the process exits 0 in a moment. It took ~12 s of failed sends, and
    sometimes crashed with SIGSEGV, when the worker stopped after the loop."""
    server = EmbeddedServer(tmp_path, {"PLAYGROUND_TEST_TOKEN_S": "0.1"}, argv=FAKE_PLAYGROUND)  # a 25 s reply
    try:
        server.wait_ready()
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "x" * 200}],
                "max_tokens": 250, "stream": True}
        request = Request(f"{server.base_url}/v1/chat/completions", json.dumps(body).encode(),
                          {"Content-Type": "application/json"})
        with urlopen(request, timeout=60) as stream:
            for line in stream:
                if b"delta" in line:
                    break
            else:
                pytest.fail("the stream ended before its first text")
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            rest = stream.read().decode()
            exit_code = server.process.wait(30)
            took = time.monotonic() - started
    finally:
        if server.process.poll() is None:
            server.process.kill()
    log = server.log_path.read_text()
    assert exit_code == 0, log[-3000:]
    assert took < 5, log[-3000:]
    assert "the worker shut down before this request finished (it had 0 s to drain)" in rest
    assert rest.rstrip().endswith("data: [DONE]")
    assert "event loop stopped" not in log
