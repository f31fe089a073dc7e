"""/healthz: can this web process reach its database and broker, and which GPU workers are alive?"""
import time

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from playground.celery import app as celery_app

from ..shared import registry

BROKER_TIMEOUT_S = 2.0


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False


def _broker_ok() -> bool:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        return True
    except Exception:
        return False


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the web side works (status "ok", or "degraded" while no worker is ready); 503 when not."""
    database, broker = _database_ok(), _broker_ok()
    try:
        heartbeats = registry.live_workers()
    except Exception:
        heartbeats = []
    now = time.time()
    workers = [
        {
            "name": w["name"],
            "queue": w["queue"],
            "state": w["state"],
            "age_s": round(now - w["time"], 2),
            "metrics": w.get("metrics", {}),
        }
        for w in heartbeats
    ]
    if not (database and broker):
        status = "down"
    elif any(w["state"] == "ready" for w in workers):
        status = "ok"
    else:
        status = "degraded"
    body = {
        "status": status,
        "database": {"ok": database},
        "broker": {"ok": broker, "url": celery_app.conf.broker_url.split(":", 1)[0]},
        "workers": workers,
    }
    return JsonResponse(body, status=503 if status == "down" else 200)
