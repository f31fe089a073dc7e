"""Websocket routes (wrapped in auth and origin checks by playground.asgi)."""
from django.urls import path

from playground.chat.consumers import ChatConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
]
