from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The payments console: the admin of the payments app's models, its dashboard, limits and rails pages."""

    name = "console"
