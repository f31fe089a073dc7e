"""ASGI entry point for daphne: Django over HTTP, Channels consumers over websockets.

Websockets pass Channels' AllowedHostsOriginValidator (Origin must match ALLOWED_HOSTS) and the session/auth
middleware, so consumers see `scope["user"]` and `scope["session"]`.
"""
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
django.setup(set_prefix=False)  # as get_asgi_application does, before the imports below touch models

from playground.request_threads import PooledThreadsASGIHandler  # noqa: E402

django_asgi_app = PooledThreadsASGIHandler()
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from playground.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files from the same server: the playground has no separate web server in front of it.
        "http": ASGIStaticFilesHandler(django_asgi_app) if settings.PLAYGROUND_SERVE_STATIC else django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
