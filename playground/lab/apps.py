from django.apps import AppConfig


class LabConfig(AppConfig):
    name = "playground.lab"
    label = "lab"
    verbose_name = "PagedAttention lab"
