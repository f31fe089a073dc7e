"""The user's settings page: create and revoke API keys (the new secret is shown once)."""
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from .limits import quota_for
from .models import ApiKey

MAX_KEY_NAME = 100


@login_required
@require_http_methods(["GET", "POST"])
def settings_page(request: HttpRequest) -> HttpResponse:
    new_secret, error = None, None
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            name = request.POST.get("name", "").strip()
            if len(name) > MAX_KEY_NAME:
                error = f"The name may have at most {MAX_KEY_NAME} characters."
            else:
                _, new_secret = ApiKey.objects.issue(request.user, name)
        elif action == "revoke":
            key_id = request.POST.get("key_id", "")
            if key_id.isdigit():
                ApiKey.objects.filter(user=request.user, pk=int(key_id)).update(revoked=True)
            return redirect("account-settings")
        else:
            error = "Unknown action."
    context = {
        "keys": ApiKey.objects.filter(user=request.user),
        "new_secret": new_secret,
        "error": error,
        "quota": quota_for(request.user),
        "api_base": request.build_absolute_uri("/v1"),
    }
    return render(request, "accounts/settings.html", context, status=400 if error else 200)
