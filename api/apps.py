from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The HTTP edge: the REST API under /api/v1/."""

    name = "api"
