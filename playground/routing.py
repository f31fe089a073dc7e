"""Websocket routes (wrapped in auth and origin checks by playground.asgi)."""
from django.urls import path

from playground.chat.consumers import ChatConsumer
from playground.demo.consumers import DemoConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/demo/", DemoConsumer.as_asgi()),
]
