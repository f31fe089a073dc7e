"""The dashboard over the distributed stack: daphne, two real Celery GPU workers and the real Redis.

Several workers side by side: a staff memory socket gets a snapshot from each (they answer its connect), a
reset reaches the named worker, and `/metrics` on the web server shows both workers' figures.
"""
import json
import subprocess
import sys

import pytest
import requests
from live_stack import ENGINE_ENV, REPO, LiveStack, running_stack
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

WORKERS = ("w1@kv", "w2@kv")
STAFF = {"username": "ada", "password": "analytical-engine-1843"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    def create_staff(live: LiveStack) -> None:
        env = {**live.env, "DJANGO_SUPERUSER_PASSWORD": STAFF["password"]}
        subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username", STAFF["username"],
                        "--email", "ada@example.com"], cwd=REPO, env=env, check=True, timeout=120)

    with running_stack(tmp_path_factory.mktemp("dashboard-live"), WORKERS, create_staff) as live:
        yield live


def staff_session(stack: LiveStack) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.get(f"{stack.base_url}/accounts/login/", timeout=10)
    response = session.post(
        f"{stack.base_url}/accounts/login/",
        data={**STAFF, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        headers={"Referer": f"{stack.base_url}/accounts/login/"},
        timeout=10,
    )
    assert response.ok and "sessionid" in session.cookies
    return session


def memory_socket(stack: LiveStack, session: requests.Session):
    cookies = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    url = stack.ws_url.replace("/ws/chat/", "/ws/memory/")
    return connect(url, origin=stack.base_url, additional_headers={"Cookie": cookies}, proxy=None, open_timeout=10)


def frames_until_quiet(ws, quiet_s: float = 3.0) -> list[dict]:
    """Frames until none came for `quiet_s` (longer than a worker's publishing linger after a change)."""
    frames = []
    while True:
        try:
            frames.append(json.loads(ws.recv(timeout=quiet_s)))
        except TimeoutError:
            return frames


def test_memory_feed_and_metrics_show_every_worker(stack):
    session = staff_session(stack)
    assert session.get(f"{stack.base_url}/memory/", timeout=10).status_code == 200
    with memory_socket(stack, session) as ws:
        frames = frames_until_quiet(ws)  # each worker's answer to the connect (and any last busy ones)
        assert {f["type"] for f in frames} == {"snapshot"}
        snapshots = {f["worker"]: f for f in frames}
        assert set(snapshots) == set(WORKERS)
        for frame in snapshots.values():
            assert frame["metrics"]["num_blocks_total"] == int(ENGINE_ENV["ENGINE_NUM_KV_BLOCKS"])
            assert len(frame["block_map"]["states"]) == frame["metrics"]["num_blocks_total"]
            assert frame["requests"] == []

        # Idle workers are quiet; the reset worker publishes its new state at once.
        ws.send(json.dumps({"type": "reset_prefix_cache", "worker": WORKERS[1]}))
        replies = frames_until_quiet(ws)
        assert {"type": "ack", "message": f"Prefix cache of {WORKERS[1]} reset."} in replies
        assert {r["worker"] for r in replies if r["type"] == "snapshot"} == {WORKERS[1]}

    text = requests.get(f"{stack.base_url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    running = families["vllm:num_requests_running"].samples
    assert {s.labels["worker"] for s in running} == set(WORKERS)
    blocks = {s.labels["worker"]: s.value for s in families["playground:num_blocks_total"].samples}
    assert blocks == {name: snapshots[name]["metrics"]["num_blocks_total"] for name in WORKERS}


def test_memory_socket_and_page_refuse_anonymous_visitors(stack):
    response = requests.get(f"{stack.base_url}/memory/", allow_redirects=False, timeout=10)
    assert response.status_code == 302 and response.headers["Location"].startswith("/accounts/login/")
    url = stack.ws_url.replace("/ws/chat/", "/ws/memory/")
    with pytest.raises(InvalidStatus) as refused:  # closed before the handshake completes: daphne answers 403
        connect(url, origin=stack.base_url, proxy=None, open_timeout=10)
    assert refused.value.response.status_code == 403
