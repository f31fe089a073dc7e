"""playground/request_threads.py: an HTTP request's thread-sensitive work runs on a thread kept for the next
request, one request at a time per thread, with Django's request signals still closing that thread's database
connections when a request ends, unless CONN_MAX_AGE keeps them."""
from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.test import override_settings
from django.urls import path

from playground.request_threads import PooledThreadsASGIHandler

_names = threading.local()
released = threading.Event()


def thread_name() -> str:
    """A name for the calling thread that no other thread ever gets (thread idents are reused)."""
    if not hasattr(_names, "name"):
        _names.name = uuid.uuid4().hex
    return _names.name


async def which_thread(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"thread": await sync_to_async(thread_name)()})


def held() -> str:
    released.wait(10)
    return thread_name()


async def hold(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"thread": await sync_to_async(held)()})


def query(request: HttpRequest) -> JsonResponse:
    """A synchronous view (Django runs it on the request's thread): was a connection open when it started?"""
    was_open = connection.connection is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"thread": thread_name(), "was_open": was_open})


urlpatterns = [path("thread", which_thread), path("hold", hold), path("query", query)]


async def get(handler: ASGIHandler, url: str) -> dict:
    """GET `url` straight through `handler` (no server); the JSON body."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": url, "raw_path": url.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    requested, never = asyncio.Event(), asyncio.Event()
    sent: list[dict] = []

    async def receive() -> dict:
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await never.wait()  # the client never disconnects

    async def send(message: dict) -> None:
        sent.append(message)

    await handler(scope, receive, send)
    assert sent[0]["status"] == 200, sent
    return json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@override_settings(ROOT_URLCONF=__name__)
def test_requests_one_after_another_run_on_one_kept_thread():
    async def twice(handler: ASGIHandler) -> list[str]:
        return [(await get(handler, "/thread"))["thread"] for _ in range(2)]

    first, second = asyncio.run(twice(PooledThreadsASGIHandler()))
    assert first == second
    first, second = asyncio.run(twice(ASGIHandler()))  # Django's own: a new thread for each request
    assert first != second


@override_settings(ROOT_URLCONF=__name__)
def test_requests_at_the_same_time_have_threads_of_their_own():
    async def overlapping() -> tuple[dict, dict]:
        handler = PooledThreadsASGIHandler()
        holding = asyncio.ensure_future(get(handler, "/hold"))
        await asyncio.sleep(0.1)  # its thread is now held
        try:
            other = await asyncio.wait_for(get(handler, "/thread"), 5)  # a shared thread would wait for the hold
        finally:
            released.set()
        return await holding, other

    released.clear()
    held_by, other = asyncio.run(overlapping())
    assert held_by["thread"] != other["thread"]


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize(("max_age", "kept"), [(0, False), (None, True)])
def test_the_kept_thread_s_database_connection_is_closed_or_kept_as_conn_max_age_says(monkeypatch, max_age, kept):
    """CONN_MAX_AGE 0, a database server's: the request signals close the connection at each request's end, on
    that thread. None, SQLite's (playground/envconfig.py): the thread's next request reuses it."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)

    async def twice() -> list[dict]:
        handler = PooledThreadsASGIHandler()
        return [await get(handler, "/query") for _ in range(2)]

    first, second = asyncio.run(twice())
    assert first["thread"] == second["thread"]
    assert second["was_open"] is kept
