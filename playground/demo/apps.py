from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "playground.demo"
    label = "demo"
    verbose_name = "Multi-user demo"
