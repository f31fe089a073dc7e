from django.urls import path

from . import views

urlpatterns = [
    path("models", views.models, name="api-models"),
    path("completions", views.completions, name="api-completions"),
    path("chat/completions", views.chat_completions, name="api-chat-completions"),
    path("responses", views.responses, name="api-responses"),
    path("tokenize", views.tokenize, name="api-v1-tokenize"),  # also at the root, where vLLM serves them
    path("detokenize", views.detokenize, name="api-v1-detokenize"),
]
