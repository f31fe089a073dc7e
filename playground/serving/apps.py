from django.apps import AppConfig


class ServingConfig(AppConfig):
    """The bridge to the GPU workers: Celery task, engine service, worker registry, embedded runner."""

    name = "playground.serving"
    label = "serving"
