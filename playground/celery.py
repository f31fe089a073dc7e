"""The Celery app. GPU workers consume queue `gpu` plus their own queue `gpu.<worker name>`.

Run a worker with `celery -A playground worker -Q gpu` (the threads pool is the default here, because one
process must host one engine shared by many concurrent tasks).
"""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

app = Celery("playground")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["playground.serving.worker"])  # the task lives with the worker code
