"""Pages of the dashboard: the staff-only memory view and Prometheus' `/metrics`."""
from django.contrib.auth.decorators import user_passes_test
from django.core.cache import cache
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.text import slugify
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from playground.accounts.access import is_staff
from playground.serving.shared import kv_feed, registry
from playground.serving.web import backlog

from .prometheus import registry_for


@require_GET
@user_passes_test(is_staff)  # anyone else is sent to the login page
def memory(request: HttpRequest) -> HttpResponse:
    """The admin memory view; everything on it comes live over `/ws/memory/` (static/memory/main.js)."""
    return render(request, "memory/index.html")


@require_GET
@user_passes_test(is_staff)
def recording(request: HttpRequest, worker: str) -> HttpResponse:
    """A worker's last stopped recording as a JSON download (replay it on /lab/ with "Import recording")."""
    data = cache.get(kv_feed.recording_key(worker))
    if data is None:
        raise Http404("no recording of this worker (none was stopped in the last hour)")
    response = JsonResponse(data)
    response["Content-Disposition"] = f'attachment; filename="recording-{slugify(worker)}.json"'
    return response


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Every live worker's figures in Prometheus' text format (see prometheus.py and docs/metrics.md).
    Unauthenticated, as Prometheus scrapes it: it names workers and counts, never users or requests."""
    return HttpResponse(generate_latest(registry_for(registry.live_workers, backlog.queue_backlog)),
                        content_type=CONTENT_TYPE_LATEST)
