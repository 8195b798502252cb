"""Delete Idempotency-Key records older than the retention (24 hours at least).

Beat runs the same purge hourly (``payments.tasks.purge_idempotency_keys``); the command
is for a purge by hand, or with a retention longer than 24 hours.
"""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from payments.idempotency import KEY_RETENTION, idempotency_keys_purge


class Command(BaseCommand):
    help = "Delete Idempotency-Key records older than --hours (default and minimum 24)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--hours", type=float, default=KEY_RETENTION.total_seconds() / 3600,
            help="Age in hours above which keys are deleted (at least 24).",
        )

    def handle(self, *args, hours: float, **options):
        if hours < KEY_RETENTION.total_seconds() / 3600:
            raise CommandError("Keys are kept at least 24 hours: --hours must be 24 or more.")
        deleted = idempotency_keys_purge(older_than=timedelta(hours=hours))
        self.stdout.write(f"deleted {deleted} idempotency keys older than {hours:g} hours")
