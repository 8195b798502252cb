from django.apps import AppConfig


class RecurringConfig(AppConfig):
    """Recurring payments: the series and their occurrences."""

    name = "recurring"
