"""The chat page and the conversation JSON endpoints (docs/protocol.md, "Pages")."""
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from playground.accounts.access import may_use_playground
from playground.serving.web import sampling
from playground.serving.web.edge import CLOSE_CODES
from playground.serving.web.models import served_models

from .models import Conversation
from .store import ConversationNotFound, conversation_detail, conversation_summary, delete_message, show_branch
from .window import meter_config

WS_PATH = "/ws/chat/"
MAX_LISTED = 100


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
            "login": reverse("login"),
            "logout": reverse("logout"),
            "admin": reverse("admin:index"),
        },
        "conversation": conversation_detail(active) if active else None,
    }
    context = {
        "conversations": list(_owned(request)[:MAX_LISTED]),
        "active_conversation": active,
        "ws_path": WS_PATH,
        "limits": settings.PLAYGROUND_LIMITS,
        "chat_config": chat_config,
    }
    return render(request, "chat/index.html", context)


@require_GET
@chat_access
def conversation_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"conversations": [conversation_summary(c) for c in _owned(request)[:MAX_LISTED]]})


@require_http_methods(["GET", "DELETE"])
@chat_access
def conversation(request: HttpRequest, conversation_id) -> HttpResponse:
    found = _get_owned(request, conversation_id)
    if request.method == "DELETE":
        found.delete()
        return HttpResponse(status=204)
    return JsonResponse(conversation_detail(found))


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
