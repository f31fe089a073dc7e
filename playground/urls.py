from django.contrib import admin
from django.urls import include, path

from playground.api import views as api_views
from playground.chat import preset_views
from playground.chat import views as chat_views
from playground.serving.web import views as serving_views

urlpatterns = [
    path("", chat_views.index, name="chat"),
    path("c/<uuid:conversation_id>/", chat_views.index, name="chat-conversation"),
    path("api/conversations/", chat_views.conversation_list, name="api-conversations"),
    path("api/conversations/export/", chat_views.export, name="api-conversations-export"),
    path("api/conversations/import/", chat_views.import_conversations, name="api-conversations-import"),
    path("api/conversations/<uuid:conversation_id>/", chat_views.conversation, name="api-conversation"),
    path("api/conversations/<uuid:conversation_id>/export/", chat_views.export, name="api-conversation-export"),
    path("api/conversations/<uuid:conversation_id>/messages/<int:message_id>/", chat_views.message,
         name="api-conversation-message"),
    path("api/presets/", preset_views.preset_list, name="api-presets"),
    path("api/presets/<uuid:preset_id>/", preset_views.preset, name="api-preset"),
    path("healthz", serving_views.healthz, name="healthz"),
    path("", include("playground.dashboard.urls")),  # /memory/ and /metrics
    path("v1/", include("playground.api.urls")),
    path("health", api_views.health, name="api-health"),  # vLLM's probes, outside /v1 as vLLM has them
    path("version", api_views.version, name="api-version"),
    path("tokenize", api_views.tokenize, name="api-tokenize"),
    path("detokenize", api_views.detokenize, name="api-detokenize"),
    path("account/", include("playground.accounts.urls")),
    path("demo/", include("playground.demo.urls")),
    path("lab/", include("playground.lab.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
