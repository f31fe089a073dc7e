"""Websocket routes (wrapped in auth and origin checks by playground.asgi)."""
from django.urls import path

from playground.chat.consumers import ChatConsumer
from playground.dashboard.consumers import KvSummaryConsumer, MemoryConsumer
from playground.demo.consumers import DemoConsumer
from playground.lab.consumers import LabConsumer

websocket_urlpatterns = [
    path("ws/chat/", ChatConsumer.as_asgi()),
    path("ws/demo/", DemoConsumer.as_asgi()),
    path("ws/lab/", LabConsumer.as_asgi()),
    path("ws/memory/", MemoryConsumer.as_asgi()),
    path("ws/kv/", KvSummaryConsumer.as_asgi()),
]
