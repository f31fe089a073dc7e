"""Paged Playground's Django project.

Importing the Celery app here makes `celery -A playground worker` and Django share one configuration.
"""
from .celery import app as celery_app

__all__ = ("celery_app",)
