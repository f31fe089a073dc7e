from django.contrib import admin

from .models import Conversation, Message, Preset


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("position", "role", "content", "finish_reason", "usage", "timing", "worker")
    readonly_fields = ("usage", "timing", "worker")


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "session_key", "pinned", "last_worker", "updated_at")
    list_filter = ("pinned", "updated_at")
    search_fields = ("title", "user__username", "messages__content")
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("conversation", "position", "role", "short_content", "finish_reason", "created_at")
    list_filter = ("role", "finish_reason")
    search_fields = ("content",)
    raw_id_fields = ("conversation",)

    @admin.display(description="content")
    def short_content(self, obj: Message) -> str:
        return obj.content[:80]


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "session_key", "model", "updated_at")
    search_fields = ("name", "user__username")
