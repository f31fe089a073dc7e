from django.urls import path

from . import views

urlpatterns = [
    path("memory/", views.memory, name="memory"),
    path("memory/recording/<str:worker>/", views.recording, name="memory-recording"),
    path("metrics", views.metrics, name="metrics"),
]
