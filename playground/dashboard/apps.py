from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The KV-memory dashboard: worker snapshots, the admin memory view and Prometheus `/metrics`."""

    name = "playground.dashboard"
