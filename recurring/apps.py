from django.apps import AppConfig


class RecurringConfig(AppConfig):
    """Recurring payments: the series and their occurrences."""

    name = "recurring"

    def ready(self):
        # The engine's promoter generates the due occurrences at the start of the first
        # shard's tick; it knows no series, so the series register themselves with it.
        from payments import promoter

        from .services import recurring_generate_due

        promoter.register_first_shard_hook(recurring_generate_due)
