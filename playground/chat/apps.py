from django.apps import AppConfig


class ChatConfig(AppConfig):
    """Conversations, the chat page and the /ws/chat/ consumer."""

    name = "playground.chat"
    label = "chat"
    default_auto_field = "django.db.models.BigAutoField"
