"""Run the distributed stack for end-to-end tests: daphne and real Celery GPU workers as subprocesses, over
the real Redis at 127.0.0.1:6379 (an empty database number, flushed afterwards), with the real model.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import redis

REPO = Path(__file__).resolve().parents[2]
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_CLAIM_KEY = "paged-playground-tests:claimed"  # marks a database a live stack of the suite uses
BIN = Path(sys.executable).parent

# Small engine settings: CPU tests, short prompts.
ENGINE_ENV = {
    "ENGINE_MAX_MODEL_LEN": "512",
    "ENGINE_NUM_KV_BLOCKS": "256",
    "ENGINE_MAX_NUM_SEQS": "32",
    "ENGINE_DEVICE": "cpu",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, timeout: float) -> None:
    """Until `url` answers at all (any HTTP status)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urlopen(url, timeout=5).close()
            return
        except OSError as exc:
            if getattr(exc, "code", None) is not None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout} s") from exc
            time.sleep(0.2)


def empty_redis_db() -> int:
    """An unused Redis database number, so tests never meet other users' queues. It is claimed with a key that
    only one caller can set, so two test processes starting a stack at once never share one (LiveStack.stop
    empties it again, the claim included)."""
    for db in range(15, 0, -1):
        client = redis.Redis(REDIS_HOST, REDIS_PORT, db=db)
        if client.dbsize() == 0 and client.set(REDIS_CLAIM_KEY, os.getpid(), nx=True):
            return db
    raise RuntimeError("no empty Redis database to run the end-to-end tests in")


class PrivateRedis:
    """A redis-server of the test's own on a free port from 6390 up (no persistence: a restart is empty),
    so a test may kill and restart it without touching the shared one."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = next(p for p in range(6390, 6500) if _port_free(p))
        self.url = f"redis://{REDIS_HOST}:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.workdir / "redis.log", "ab")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", REDIS_HOST, "--save", "", "--appendonly", "no"],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(REDIS_HOST, self.port).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: every client's connection breaks at once."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(REDIS_HOST, self.port)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((REDIS_HOST, port)) != 0


class LiveStack:
    def __init__(self, workdir: Path, extra_env: dict[str, str] | None = None,
                 private_redis: PrivateRedis | None = None) -> None:
        self.workdir = workdir
        self.private_redis = private_redis
        self.db = 0 if private_redis else empty_redis_db()
        redis_url = private_redis.url if private_redis else f"redis://{REDIS_HOST}:{REDIS_PORT}/{self.db}"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/chat/"
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
            "PLAYGROUND_VAR_DIR": str(workdir / "var"),
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PLAYGROUND_ALLOW_ANONYMOUS": "1",
            "SECRET_KEY": "live-stack-test-key",
            "DJANGO_SETTINGS_MODULE": "playground.settings",
            "PYTHONUNBUFFERED": "1",
            **ENGINE_ENV,
            **(extra_env or {}),
        }
        self.web: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.workdir / log_name, "wb")
        return subprocess.Popen(args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def start_web(self) -> None:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=self.env, check=True,
                       timeout=300)
        self.web = self._spawn([sys.executable, "manage.py", "web", "--port", str(self.port)], "web.log")
        self.wait(lambda: self.health() is not None, 60, "daphne to serve /healthz")

    def start_worker(self, name: str, program: list[str] | None = None) -> None:
        """A Celery GPU worker; `program` replaces the `celery` executable (a fault-injecting wrapper)."""
        self.workers[name] = self._spawn(
            [*(program or [str(BIN / "celery")]), "-A", "playground", "worker", "-Q", "gpu", "-n", name,
             "-c", "32", "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO"],
            f"worker-{name}.log",
        )

    def wait_workers_ready(self, timeout: float = 300) -> None:
        def ready() -> bool:
            states = {w["name"]: w["state"] for w in (self.health() or {}).get("workers", [])}
            return all(states.get(name) == "ready" for name in self.workers)

        self.wait(ready, timeout, f"workers {sorted(self.workers)} to load the model")

    def kill_worker(self, name: str) -> None:
        """SIGKILL: no clean shutdown, no goodbye heartbeat."""
        self.workers[name].kill()
        self.workers[name].wait(10)

    def health(self) -> dict[str, Any] | None:
        try:
            with urlopen(f"{self.base_url}/healthz", timeout=5) as response:
                return json.load(response)
        except OSError as exc:
            body = getattr(exc, "read", None)
            return json.loads(body()) if body else None

    def worker_metrics(self, name: str) -> dict[str, Any]:
        for worker in (self.health() or {}).get("workers", []):
            if worker["name"] == name:
                return worker["metrics"]
        raise LookupError(f"worker {name} is not alive")

    def wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; logs in {self.workdir}")
            time.sleep(0.2)

    def stop(self) -> None:
        for process in [*self.workers.values(), self.web]:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers.values(), self.web]:
            if process is not None:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
        if self.private_redis is None:
            redis.Redis(REDIS_HOST, REDIS_PORT, db=self.db).flushdb()


@contextmanager
def running_stack(workdir: Path, workers: tuple[str, ...],
                  before_workers: Callable[[LiveStack], None] | None = None) -> Iterator[LiveStack]:
    """The web server, then (after `before_workers`, e.g. creating a user) the named workers with their model
    loaded; everything stopped and the Redis database flushed on exit."""
    live = LiveStack(workdir)
    try:
        live.start_web()
        if before_workers is not None:
            before_workers(live)
        for name in workers:
            live.start_worker(name)
        live.wait_workers_ready()
        yield live
    finally:
        live.stop()


FAKE_PLAYGROUND = ("tests/playground/fake_playground.py",)  # `argv` for the scripted engine instead of the model


class EmbeddedServer:
    """`python manage.py playground` in a subprocess: SQLite, in-memory broker and channel layer, one
    in-process worker with the real model (with `argv=FAKE_PLAYGROUND`, the scripted engine of fake_engine.py).
    `url` is what the command printed."""

    def __init__(self, workdir: Path, extra_env: dict[str, str] | None = None,
                 argv: tuple[str, ...] = ("manage.py",)) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/chat/"
        self.url: str | None = None
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
        env.update(ENGINE_ENV, PLAYGROUND_VAR_DIR=str(workdir), PYTHONUNBUFFERED="1", **(extra_env or {}))
        self.log_path = workdir / "embedded.log"
        self._log = open(self.log_path, "w+")
        self.process = subprocess.Popen(
            [sys.executable, *argv, "playground", "--port", str(self.port)],
            cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_url(self, timeout: float = 120) -> str:
        """The URL the command printed once it listens."""
        deadline = time.monotonic() + timeout
        while self.url is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded server did not start; see {self.log_path}")
            time.sleep(0.3)
            found = re.search(r"running at (http://\S+)", self.log_path.read_text())
            self.url = found.group(1) if found else None
        return self.url

    def wait_ready(self, timeout: float = 300) -> None:
        """Until /healthz shows the in-process worker's engine loaded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urlopen(f"{self.base_url}/healthz", timeout=5) as response:
                    if json.load(response)["status"] == "ok":
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded worker did not get ready; see {self.log_path}")
            time.sleep(0.3)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, as Ctrl-C or a service manager would; returns the exit code (kills after `timeout`)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self._log.close()
