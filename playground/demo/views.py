"""The presenter page /demo/: everything live comes over /ws/demo/ (see consumers.py)."""
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from playground.accounts.access import may_present, may_use_playground

WS_PATH = "/ws/demo/"


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    if not may_use_playground(request.user):
        return redirect_to_login(request.get_full_path())
    config = {
        "ws_path": WS_PATH,
        "can_present": may_present(request.user),
        "max_users": settings.PLAYGROUND_DEMO_MAX_USERS,
        "max_tokens": settings.PLAYGROUND_LIMITS["max_tokens"],
        "cache_salt_mode": settings.PLAYGROUND_CACHE_SALT,
    }
    return render(request, "demo/index.html", {"demo_config": config})
