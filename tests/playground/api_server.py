"""The embedded playground (`python manage.py playground` in a subprocess, real model on the CPU) with API
keys, for the OpenAI API, fuzz and demo tests. Builds on live_stack.EmbeddedServer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import Request, urlopen

from live_stack import ENGINE_ENV, REPO, EmbeddedServer

MODEL = "smollm2-135m-instruct"


class ApiServer(EmbeddedServer):
    def __init__(self, workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        super().__init__(workdir, extra_env)
        self.manage_env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
        self.manage_env.update(PLAYGROUND_VAR_DIR=str(workdir), **(extra_env or {}))
        self.api_base = f"{self.base_url}/v1"

    def manage(self, *args: str) -> str:
        """Run a management command against the server's database; returns its stdout."""
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.manage_env, check=True,
                              timeout=120, capture_output=True, text=True)
        return done.stdout.strip()

    def api_key(self, username: str) -> str:
        return self.manage("create_api_key", username).splitlines()[-1]

    def set_quota(self, username: str, **fields: int) -> None:
        script = ("from django.contrib.auth.models import User; from playground.accounts.models import UserQuota; "
                  f"UserQuota.objects.update_or_create(user=User.objects.get(username={username!r}), defaults={fields!r})")
        self.manage("shell", "-c", script)

    def worker_metrics(self) -> dict:
        with urlopen(f"{self.base_url}/healthz", timeout=5) as response:
            return json.load(response)["workers"][0]["metrics"]

    def wait_idle(self, timeout: float = 30) -> dict:
        """Until the worker runs nothing and holds no block (its heartbeat lags about a second)."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = self.worker_metrics()
            idle = metrics["num_requests_running"] == 0 and metrics["num_requests_waiting"] == 0
            if idle and metrics["num_blocks_used"] == 0:
                return metrics
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker is not idle: {metrics}")
            time.sleep(0.3)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """A raw POST (any status), for inputs the openai client would refuse to send."""
        request = Request(f"{self.base_url}{path}", data=body, headers=headers, method="POST")
        try:
            with urlopen(request, timeout=300) as response:
                return response.status, response.read()
        except OSError as exc:
            read = getattr(exc, "read", None)
            if read is None:
                raise
            return exc.code, read()


def start(workdir: Path, extra_env: dict[str, str] | None = None) -> ApiServer:
    server = ApiServer(workdir, extra_env)
    try:
        server.wait_url()
        server.wait_ready()
    except BaseException:
        server.process.kill()
        raise
    return server


def reference_llm(**engine_args):
    """The engine itself, in the test process, with the server's engine settings: the greedy oracle."""
    from inference import LLM

    return LLM(model=MODEL, device="cpu", max_model_len=int(ENGINE_ENV["ENGINE_MAX_MODEL_LEN"]),
               num_kv_blocks=int(ENGINE_ENV["ENGINE_NUM_KV_BLOCKS"]), **engine_args)
