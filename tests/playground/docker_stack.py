"""Docker for the compose smoke test (test_compose.py): a daemon, the images, and the stack run with Debian's
docker-compose (1.29) under a project name of its own.

Where no Docker answers, `ensure_docker` raises `DockerUnavailable` with the reason (the test skips), except
under CI=true, where it first installs docker.io, docker-compose and debootstrap with apt and starts dockerd
(root only). Where no registry answers, the official images are replaced by local builds (bin/docker-local-images).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = "paged-playground-smoke"
IMAGE = "paged-playground:smoke"
OFFICIAL = {"BASE_IMAGE": "python:3.11-slim", "POSTGRES_IMAGE": "postgres:16-alpine", "REDIS_IMAGE": "redis:7-alpine"}
LOCAL = {"BASE_IMAGE": "paged-playground-base:bookworm", "POSTGRES_IMAGE": "paged-playground-postgres:local",
         "REDIS_IMAGE": "paged-playground-redis:local"}
PACKAGES = {"dockerd": "docker.io", "docker-compose": "docker-compose", "debootstrap": "debootstrap"}
DOCKERD_LOG = "/tmp/paged-playground-dockerd.log"
STALE_PID_FILES = ("/var/run/docker.pid", "/var/run/docker/containerd/containerd.pid")


class DockerUnavailable(Exception):
    pass


def _ok(*args: str, timeout: float = 60) -> bool:
    try:
        return subprocess.run(args, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_docker() -> str:
    """The docker CLI to use, with a daemon answering and docker-compose installed."""
    if os.environ.get("CI") == "true":
        _install_and_start()
    cli = docker_cli()
    if cli is None:
        raise DockerUnavailable("no docker CLI on PATH (apt-get install docker.io)")
    if not _ok(cli, "info"):
        raise DockerUnavailable("no Docker daemon answers `docker info` (start dockerd)" + _log_tail())
    if shutil.which("docker-compose") is None:
        raise DockerUnavailable("no docker-compose on PATH (apt-get install docker-compose)")
    return cli


def _install_and_start() -> None:
    missing = [package for command, package in PACKAGES.items() if shutil.which(command) is None]
    if missing and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, timeout=1200,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if shutil.which("dockerd") and os.geteuid() == 0 and not _ok("docker", "info"):
        if subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode != 0:
            _remove_stale_pid_files()
        with open(DOCKERD_LOG, "ab") as log:
            daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not _ok("docker", "info", timeout=10) and time.monotonic() < deadline and daemon.poll() is None:
            time.sleep(1)


def _remove_stale_pid_files() -> None:
    """With no dockerd running, its pid files are left by a daemon that was killed (a session's end kills its
    background processes). dockerd refuses to start while the pid written there names a live process, and on a
    machine that has since restarted its programs that pid is often some other process's."""
    for pid_file in STALE_PID_FILES:
        Path(pid_file).unlink(missing_ok=True)


def _log_tail() -> str:
    """The end of the log of a dockerd this module started, which says why it is not answering."""
    try:
        lines = Path(DOCKERD_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "; dockerd's log ends: " + " | ".join(lines[-5:])


def docker_cli() -> str | None:
    """The first docker CLI that builds with BuildKit (buildx, or a client before 23 that has it built in),
    so rebuilds reuse the layer cache; else whichever is on PATH (the legacy builder)."""
    candidates = [c for c in dict.fromkeys([shutil.which("docker"), "/usr/bin/docker"]) if c and os.path.exists(c)]
    return next((cli for cli in candidates if _buildkit(cli)), candidates[0] if candidates else None)


def _buildkit(cli: str) -> bool:
    version = subprocess.run([cli, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True)
    major = int(version.stdout.split(".")[0]) if version.stdout[:1].isdigit() else 0
    return 0 < major < 23 or _ok(cli, "buildx", "version")


def images(cli: str) -> dict[str, str]:
    """BASE_IMAGE, POSTGRES_IMAGE and REDIS_IMAGE: each official image when it is here or can be pulled, else
    its local build."""
    chosen = {key: image for key, image in OFFICIAL.items()
              if _ok(cli, "image", "inspect", image) or _ok(cli, "pull", image, timeout=120)}
    if len(chosen) < len(OFFICIAL):
        path = f"{Path(cli).parent}:{os.environ['PATH']}"
        subprocess.run([str(REPO / "bin" / "docker-local-images")], check=True, timeout=1800,
                       env={**os.environ, "PATH": path})
    return {key: chosen.get(key, LOCAL[key]) for key in OFFICIAL}


def stage_build_extras() -> None:
    """Put the host's CPU torch wheel and pip's CA bundle in docker/build-extra/ (git-ignored), so the build
    installs that wheel instead of the index's CUDA build and reaches the index where the host does."""
    extra = REPO / "docker" / "build-extra"
    places = [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]
    for place in places:
        for wheel in glob.glob(os.path.join(place, "torch-2.13.0+cpu-cp311-*.whl")):
            if not (extra / Path(wheel).name).exists():
                shutil.copy(wheel, extra)
    cert = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    if os.path.isfile(cert):
        shutil.copy(cert, extra / "ca.crt")


def build(cli: str, base: str) -> float:
    """Build the image from `base`; returns the seconds it took. Its steps run on the host's network: a step on
    Docker's bridge adds and removes an interface, which fails the browser tests' page loads (network_lock.py)."""
    stage_build_extras()
    began = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "1" if _buildkit(cli) else "0"}
    subprocess.run([cli, "build", "--network", "host", "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE, str(REPO)],
                   check=True, timeout=3600, env=env, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def image_size_mb(cli: str) -> float:
    out = subprocess.run([cli, "image", "inspect", "-f", "{{.Size}}", IMAGE], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1e6


class ComposeStack:
    """`docker-compose -p paged-playground-smoke -f docker-compose.yml ...` with the test's environment."""

    def __init__(self, cli: str, env: dict[str, str]) -> None:
        self.cli = cli
        self.env = {**os.environ, "PATH": f"{Path(cli).parent}:{os.environ['PATH']}", **env}

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker-compose", "-p", PROJECT, "-f", str(REPO / "docker-compose.yml"), *args],
                              cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()

    def health(self, service: str) -> str:
        container = self.container(service)
        if not container:
            return "absent"
        out = subprocess.run([self.cli, "inspect", "-f", "{{json .State}}", container], capture_output=True, text=True)
        state = json.loads(out.stdout or "{}")
        return (state.get("Health") or {}).get("Status") or state.get("Status", "absent")

    def wait_healthy(self, services: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (states := {s: self.health(s) for s in services}) and any(v != "healthy" for v in states.values()):
            if time.monotonic() > deadline:
                logs = self.run("logs", "--tail", "40", check=False).stdout
                raise TimeoutError(f"not healthy after {timeout} s: {states}\n{logs}")
            time.sleep(3)

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", timeout=300, check=False)
