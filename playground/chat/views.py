"""The chat page and the conversation JSON endpoints (docs/protocol.md, "Pages")."""
import json
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from playground.accounts.access import may_use_playground
from playground.serving.web import sampling
from playground.serving.web.edge import CLOSE_CODES, InvalidInput, TooLarge, parse_json_object
from playground.serving.web.models import served_models

from . import transfer
from .listing import list_page
from .models import Conversation
from .store import (
    ConversationNotFound,
    conversation_detail,
    conversation_summary,
    delete_message,
    show_branch,
    update_conversation,
)
from .window import meter_config

WS_PATH = "/ws/chat/"
EXPORT_FORMATS = {"json": "application/json", "markdown": "text/markdown; charset=utf-8"}


def chat_access(view):
    """Only who may use the playground (accounts.access); each anonymous visitor gets a session to own their chats."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not may_use_playground(request.user):
            if request.path.startswith("/api/"):
                return JsonResponse({"error": "login required"}, status=401)
            return redirect_to_login(request.get_full_path())
        if not request.user.is_authenticated and not request.session.session_key:
            request.session.save()
        return view(request, *args, **kwargs)

    return wrapper


def _owned(request: HttpRequest):
    return Conversation.objects.owned_by(request.user, request.session.session_key)


def _get_owned(request: HttpRequest, conversation_id) -> Conversation:
    conversation = _owned(request).filter(id=conversation_id).first()
    if conversation is None:
        raise Http404("conversation not found")
    return conversation


@require_GET
@chat_access
@ensure_csrf_cookie  # the page's JSON writes send it back; an anonymous visitor's page has no form that would set it
def index(request: HttpRequest, conversation_id=None) -> HttpResponse:
    active = _get_owned(request, conversation_id) if conversation_id else None
    user = request.user
    chat_config = {
        "ws_path": WS_PATH,
        "sampling": sampling.page_specs(settings.PLAYGROUND_LIMITS),  # the page's controls, from the one table
        "models": served_models(),  # the base model, then the LoRA adapters (the page's model picker)
        "limits": settings.PLAYGROUND_LIMITS,
        "context": meter_config(),  # the composer's context meter
        "close_codes": CLOSE_CODES,
        "user": {
            "username": user.get_username() if user.is_authenticated else "",
            "is_authenticated": user.is_authenticated,
            "is_staff": user.is_staff,
        },
        "urls": {
            "conversations": reverse("api-conversations"),
            "presets": reverse("api-presets"),
            "login": reverse("login"),
            "logout": reverse("logout"),
            "admin": reverse("admin:index"),
        },
        "conversation": conversation_detail(active) if active else None,
    }
    context = {
        "conversations": list_page(_owned(request)).conversations,
        "active_conversation": active,
        "ws_path": WS_PATH,
        "limits": settings.PLAYGROUND_LIMITS,
        "chat_config": chat_config,
    }
    return render(request, "chat/index.html", context)


def refusing(view):
    """A refused input (InvalidInput: its message names the field) is a 400, or a 413 when it is too large."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except InvalidInput as exc:
            return JsonResponse({"error": str(exc)}, status=413 if isinstance(exc, TooLarge) else 400)

    return wrapper


def _params(request: HttpRequest, known: set[str]) -> dict[str, str]:
    unknown = sorted(set(request.GET) - known)
    if unknown:
        raise InvalidInput(f"{unknown[0]}: unknown parameter (this endpoint takes {', '.join(sorted(known))})")
    return request.GET.dict()


@require_GET
@chat_access
@refusing
def conversation_list(request: HttpRequest) -> JsonResponse:
    """A page of the caller's conversations (pinned first, then newest), searched by `q`, after `cursor`."""
    params = _params(request, {"q", "cursor"})
    page = list_page(_owned(request), params.get("q", ""), params.get("cursor"))
    return JsonResponse({"conversations": [conversation_summary(c) for c in page.conversations],
                         "next": page.next_cursor})


@require_http_methods(["GET", "PATCH", "DELETE"])
@chat_access
@refusing
def conversation(request: HttpRequest, conversation_id) -> HttpResponse:
    found = _get_owned(request, conversation_id)
    if request.method == "DELETE":
        found.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        limits = settings.PLAYGROUND_LIMITS
        body = parse_json_object(request.body, limits["max_frame_bytes"], limits["max_json_depth"], "request body")
        update_conversation(found, body)
        return JsonResponse(conversation_summary(found))
    return JsonResponse(conversation_detail(found))


@require_GET
@chat_access
@refusing
def export(request: HttpRequest, conversation_id=None) -> HttpResponse:
    """Download one conversation (or, without an id, all the caller's) as JSON (the tree) or Markdown."""
    fmt = _params(request, {"format"}).get("format", "json")
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"format: must be one of {', '.join(EXPORT_FORMATS)}")
    if conversation_id is not None:
        conversations = [_get_owned(request, conversation_id)]
        name = f"conversation-{conversation_id}"
    else:
        owned = _owned(request)
        # Markdown walks each one's branch shown: its messages in one more query, not one per conversation
        conversations = list(owned.prefetch_related("messages") if fmt == "markdown" else owned)
        name = f"conversations-{timezone.now():%Y%m%d-%H%M%S}"
    if fmt == "json":
        body = json.dumps(transfer.export_json(conversations), ensure_ascii=False, indent=1)
    else:
        body = transfer.export_markdown(conversations)
    response = HttpResponse(body, content_type=EXPORT_FORMATS[fmt])
    extension = "json" if fmt == "json" else "md"
    response["Content-Disposition"] = f'attachment; filename="{name}.{extension}"'
    return response


@require_POST
@chat_access
@refusing
def import_conversations(request: HttpRequest) -> JsonResponse:
    """Import an exported JSON file (the request body): all its conversations, owned by the caller, or none."""
    # request.read(), not request.body: an export may be larger than the API's body cap, and has its own; one
    # byte over it is enough to refuse it (parse_json_object: 413)
    raw = request.read(transfer.MAX_IMPORT_BYTES + 1)
    document = parse_json_object(raw, transfer.MAX_IMPORT_BYTES, settings.PLAYGROUND_LIMITS["max_json_depth"],
                                 "file")
    created = transfer.import_conversations(document, request.user, request.session.session_key)
    return JsonResponse({"conversations": [conversation_summary(c) for c in created]}, status=201)


@require_http_methods(["POST", "DELETE"])
@chat_access
def message(request: HttpRequest, conversation_id, message_id: int) -> HttpResponse:
    """POST: show the branch through this message (the page's ‹ 2/3 › arrows); DELETE: delete the message and
    what follows it on its branches. Both answer with the conversation as it is now."""
    found = _get_owned(request, conversation_id)
    try:
        (show_branch if request.method == "POST" else delete_message)(found, message_id)
    except ConversationNotFound as exc:
        raise Http404(str(exc)) from exc
    return JsonResponse(conversation_detail(found))
