"""Accounts in Django admin: usage quotas, and API keys (adding one generates the secret and shows it once)."""
from django.contrib import admin, messages

from .models import ApiKey, UserQuota, new_secret


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    list_display = ("user", "max_concurrent_requests", "tokens_per_minute")
    search_fields = ("user__username",)
    raw_id_fields = ("user",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "revoked", "created_at", "last_used_at")
    list_filter = ("revoked",)
    search_fields = ("user__username", "name", "prefix")
    raw_id_fields = ("user",)
    fields = ("user", "name", "revoked", "prefix", "created_at", "last_used_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        secret = None
        if not change:
            secret = new_secret()
            obj.set_secret(secret)
        super().save_model(request, obj, form, change)
        if secret is not None:
            messages.warning(request, f"New API key for {obj.user}: {secret} (copy it now: it is not shown again)")
