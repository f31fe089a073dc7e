"""The Content-Security-Policy header on every response (settings.PLAYGROUND_CSP; docs/security.md).

Django 5.2 has no CSP support of its own. The policy allows scripts, styles, images and connections
(websockets included: CSP 3's 'self' covers ws:/wss: to the same host) from this origin only; the pages
need nothing else, because they load plain ES modules and stylesheets and carry no inline code.
"""
from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        return self._with_policy(self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._with_policy(await self.get_response(request))

    @staticmethod
    def _with_policy(response: HttpResponse) -> HttpResponse:
        response.headers.setdefault("Content-Security-Policy", settings.PLAYGROUND_CSP)
        return response
