"""The schedule's partitions (payments/partitions.py): show them, make the months ahead,
archive a month, verify an archive.

    python manage.py partitions                      # months, default-partition rows, archives
    python manage.py partitions --ensure             # make the months ahead now
    python manage.py partitions --archive 2026-01    # archive one month (retention applies)
    python manage.py partitions --archive-due        # what the daily beat task does
    python manage.py partitions --verify var/archive/payments_scheduledpayment_p202601
"""

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from payments import partitions
from payments.models import ArchivedPartition


class Command(BaseCommand):
    help = "Show, create and archive the schedule's monthly partitions."

    def add_arguments(self, parser):
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--ensure", action="store_true", help="Create the missing partitions ahead.")
        action.add_argument("--archive", metavar="YYYY-MM", help="Archive this month (must be past retention).")
        action.add_argument("--archive-due", action="store_true", help="Archive every month past retention.")
        action.add_argument("--verify", metavar="DIR", help="Check an archive's files against its manifest.")
        parser.add_argument("--retention-days", type=int, default=None,
                            help="Override DELAYPAY_RETENTION_DAYS for --archive (at least 1).")
        parser.add_argument("--directory", default=None, help="Where --archive writes (DELAYPAY_ARCHIVE_DIR).")

    def handle(self, *args, ensure, archive, archive_due, verify, retention_days, directory, **options):
        if verify:
            try:
                manifest = partitions.verify_archive(Path(verify))
            except (OSError, ValueError, KeyError) as exc:
                raise CommandError(f"archive does not verify: {exc}") from exc
            rows = {table: entry["rows"] for table, entry in manifest["tables"].items()}
            self.stdout.write(f"{manifest['month']}: every file matches its SHA-256 and row count {rows}")
            return
        if ensure:
            created = partitions.ensure_partitions()
            self.stdout.write(f"created {', '.join(created)}" if created else "every month ahead has its partitions")
            return
        if archive_due:
            archived = partitions.archive_due_months()
            self.stdout.write(f"archived {', '.join(archived)}" if archived else "no month to archive")
            return
        if archive:
            days = settings.DELAYPAY_RETENTION_DAYS if retention_days is None else retention_days
            if days < 1:
                raise CommandError("set DELAYPAY_RETENTION_DAYS or --retention-days (1 or more)")
            try:
                month = partitions.Month.parse(archive)
            except ValueError as exc:
                raise CommandError("--archive takes a month as YYYY-MM") from exc
            cutoff = partitions.archive_cutoff(days=days)
            if month.end > cutoff:
                raise CommandError(f"{month.label} has payments made within the last {days} days")
            try:
                done = partitions.archive_month(month, cutoff=cutoff, directory=directory)
            except partitions.NotArchivable as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"archived {month.label}: {done.payments} payments to {done.location}")
            return
        state = partitions.partition_state()
        state["archived"] = [
            {"month": f"{a.month:%Y-%m}", "payments": a.payments, "location": a.location}
            for a in ArchivedPartition.objects.all()
        ]
        self.stdout.write(json.dumps(state, indent=2, default=str))
