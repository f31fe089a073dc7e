"""docker-compose.yml and the Dockerfile, checked by parsing (no Docker engine runs here).

Keys are checked against the Compose specification's names, so a typo fails here instead of on a server.
"""
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets", "include"}
SERVICE_KEYS = {
    "build", "image", "command", "entrypoint", "environment", "env_file", "ports", "expose", "volumes",
    "depends_on", "healthcheck", "deploy", "restart", "networks", "user", "working_dir", "labels", "profiles",
    "stop_grace_period", "shm_size", "ulimits", "init",
}  # fmt: skip
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
    assert "8000:8000" in compose["services"]["web"]["ports"]


def test_worker_serves_the_gpu_queue_with_threads_and_reserves_a_gpu(compose):
    worker = compose["services"]["worker"]
    command = worker["command"]
    assert command[:4] == ["celery", "-A", "playground", "worker"]
    assert command[command.index("-Q") + 1] == "gpu"
    assert command[command.index("--pool") + 1] == "threads"
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    cache_mount = next(v for v in worker["volumes"] if v.startswith("model-cache:"))
    assert cache_mount.split(":")[1] == worker["environment"]["PAGED_PLAYGROUND_CACHE"]


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
    assert dockerfile.startswith("#") and "\nFROM python:3.11" in dockerfile
    assert "pip install -r requirements.txt" in dockerfile
    copied = set(re.findall(r"^COPY (\S+)", dockerfile, flags=re.M))
    for needed in ("requirements.txt", "manage.py", "playground", "inference", "kernels", "templates", "static"):
        assert needed in copied and (REPO / needed).exists(), needed
    for name in ("web", "worker"):
        assert compose["services"][name]["build"] == "."
