"""playground/middleware.py: Django's middleware on the event loop, with the thread kept where it does I/O."""
from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import SyncToAsync
from django.contrib import messages
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, override_settings
from django.urls import path
from django.utils.deprecation import MiddlewareMixin

DJANGO_STACK = [
    "playground.security.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


async def remember(request: HttpRequest) -> JsonResponse:
    """An async view that writes the session and queues a message (both end in the database)."""
    await request.session.aset("colour", "blue")
    messages.info(request, "saved")
    return JsonResponse({})


def recall(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"colour": request.session.get("colour"), "messages": [m.message for m in
                                                                                messages.get_messages(request)]})


async def plain(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [path("remember", remember), path("recall", recall), path("plain", plain)]


@pytest.fixture
def middleware_hops(monkeypatch):
    """The thread-sensitive hops made for a middleware's methods, by method name."""
    hops: list[str] = []
    call = SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        owner = getattr(self.func, "__self__", None)
        if self._thread_sensitive and isinstance(owner, MiddlewareMixin):
            hops.append(f"{type(owner).__name__}.{self.func.__name__}")
        return await call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting)
    return hops


@override_settings(ROOT_URLCONF=__name__)
def test_a_request_through_the_stack_never_leaves_the_loop_for_the_middleware(middleware_hops):
    response = asyncio.run(AsyncClient().get("/plain"))
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY" and response["Content-Security-Policy"]  # the stack ran
    assert middleware_hops == []


@override_settings(ROOT_URLCONF=__name__, MIDDLEWARE=DJANGO_STACK)
def test_django_s_own_classes_hop_for_every_method(middleware_hops):
    """What the module replaces, and the proof that the counter above sees hops."""
    assert asyncio.run(AsyncClient().get("/plain")).status_code == 200
    assert "CsrfViewMiddleware.process_view" in middleware_hops and len(middleware_hops) >= 12


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_the_session_and_messages_are_still_saved_from_their_thread(middleware_hops):
    client = AsyncClient()
    response = asyncio.run(client.get("/remember"))
    assert response.status_code == 200  # not a SynchronousOnlyOperation from the loop
    assert sorted(middleware_hops) == ["MessageMiddleware.process_response", "SessionMiddleware.process_response"]
    recalled = asyncio.run(client.get("/recall"))
    assert json.loads(recalled.content) == {"colour": "blue", "messages": ["saved"]}
