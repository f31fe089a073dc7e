from django.contrib import admin

from .models import UserQuota


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    list_display = ("user", "max_concurrent_requests", "tokens_per_minute")
    search_fields = ("user__username",)
    raw_id_fields = ("user",)
