"""The worker container's healthcheck: `python -m playground.serving.worker.health` exits 0 when this host's
worker (Celery node `gpu@<hostname>`, as docker-compose.yml names it) has a registry entry that says `ready`:
its heartbeat is fresh and its engine is loaded. Loading, draining, failed or gone: 1, and the state is printed."""
import os
import socket
import sys


def node_name() -> str:
    return os.environ.get("PLAYGROUND_WORKER_NAME") or f"gpu@{socket.gethostname()}"


def check(name: str) -> tuple[bool, str]:
    """(healthy, the state the registry gives) for the worker `name`."""
    from ..shared import registry

    entry = registry.get(name)
    state = entry.get("state", "unknown") if entry else "absent"
    return state == "ready", state


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    import django

    django.setup()
    healthy, state = check(node_name())
    print(f"{node_name()}: {state}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
