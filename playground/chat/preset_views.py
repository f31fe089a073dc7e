"""The presets' JSON endpoints (docs/protocol.md, "JSON endpoints"), beside the conversations': the same access
rule (`chat_access`), owner rule (a preset of someone else is 404 whatever the method) and refusals (`refusing`:
a 400 naming the field)."""
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from playground.serving.web.edge import parse_json_object

from .models import Preset
from .presets import MAX_PRESETS, create_preset, preset_dict, update_preset
from .views import chat_access, refusing


def _body(request: HttpRequest) -> dict:
    limits = settings.PLAYGROUND_LIMITS
    return parse_json_object(request.body, limits["max_frame_bytes"], limits["max_json_depth"], "request body")


@require_http_methods(["GET", "POST"])
@chat_access
@refusing
def preset_list(request: HttpRequest) -> JsonResponse:
    """GET: the caller's presets by name; POST: save a new one (201)."""
    user, session_key = request.user, request.session.session_key
    if request.method == "POST":
        return JsonResponse(preset_dict(create_preset(user, session_key, _body(request))), status=201)
    owned = Preset.objects.owned_by(user, session_key)
    return JsonResponse({"presets": [preset_dict(p) for p in owned], "max_presets": MAX_PRESETS})


@require_http_methods(["GET", "PATCH", "DELETE"])
@chat_access
@refusing
def preset(request: HttpRequest, preset_id) -> HttpResponse:
    """One of the caller's presets: GET it, PATCH (rename, overwrite) it, DELETE it (204)."""
    found = Preset.objects.owned_by(request.user, request.session.session_key).filter(id=preset_id).first()
    if found is None:
        raise Http404("preset not found")
    if request.method == "DELETE":
        found.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        update_preset(found, _body(request))
    return JsonResponse(preset_dict(found))
