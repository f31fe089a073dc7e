"""The lab page /lab/: everything live comes over /ws/lab/ (see consumers.py), limits and scenarios included."""
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from playground.accounts.access import may_use_playground

WS_PATH = "/ws/lab/"


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    if not may_use_playground(request.user):
        return redirect_to_login(request.get_full_path())
    return render(request, "lab/index.html", {"lab_config": {"ws_path": WS_PATH}})
