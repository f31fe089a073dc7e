"""Django's middleware, run on the event loop where it does no I/O.

Under daphne every request goes through the middleware stack in async mode, and Django's `MiddlewareMixin` runs
each middleware's `process_request`, `process_view` and `process_response` through
`sync_to_async(thread_sensitive=True)`: a hop to the one thread every request shares and back. With the
stack in settings that was thirteen hops per request, queued behind each other's, for code that only reads
headers and sets attributes. Under `vllm bench serve` (32 concurrent chats, the engine busy in the same process)
they cost a request 0.4 s before the view ran and 0.7 s between the first token and the response's first byte
(measured with a per-request timeline, issue 41).

Each class here is Django's own with those calls made directly on the loop. The two that may touch the
database keep the hop for exactly that case: the session middleware when it must save the session, the
messages middleware when messages were read or added (its storage writes into the session). In sync mode
(the test client, WSGI) they are Django's classes unchanged.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponse
from django.middleware import clickjacking, common, csrf, security
from django.utils.deprecation import MiddlewareMixin


class OnTheLoop(MiddlewareMixin):
    """A `MiddlewareMixin` whose hooks run on the event loop in async mode; `response_needs_thread` names the
    responses whose `process_response` does I/O, which alone go to the thread."""

    def response_needs_thread(self, request: HttpRequest, response: HttpResponse) -> bool:
        return False

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.response_needs_thread(request, response):
                response = await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
            else:
                response = self.process_response(request, response)
        return response


class SecurityMiddleware(OnTheLoop, security.SecurityMiddleware):
    pass


class SessionMiddleware(OnTheLoop, sessions.SessionMiddleware):
    def response_needs_thread(self, request: HttpRequest, response: HttpResponse) -> bool:
        """Saving the session writes to the session store (the database)."""
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class CommonMiddleware(OnTheLoop, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(OnTheLoop, csrf.CsrfViewMiddleware):
    @property
    def process_view(self) -> Callable[..., Any]:
        """Django adapts a sync `process_view` with a thread hop in async mode; this one is a coroutine there.
        (It reads the cookie, the header and, for an unsafe method, the already buffered form body.)"""
        check = super().process_view
        if not self.async_mode:
            return check

        async def on_the_loop(request: HttpRequest, callback: Callable, args: tuple, kwargs: dict) -> HttpResponse | None:
            return check(request, callback, args, kwargs)

        return on_the_loop


class AuthenticationMiddleware(OnTheLoop, auth.AuthenticationMiddleware):
    pass  # sets `request.user` lazily: the user is read from the database only when a view asks


class MessageMiddleware(OnTheLoop, messages.MessageMiddleware):
    def response_needs_thread(self, request: HttpRequest, response: HttpResponse) -> bool:
        """Storing messages writes them into the session, which may first be read from the database."""
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class XFrameOptionsMiddleware(OnTheLoop, clickjacking.XFrameOptionsMiddleware):
    pass
