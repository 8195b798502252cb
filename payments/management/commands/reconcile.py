"""Check every invariant of the schedule and the ledger; exit 1 with a report if any fails."""

import json

from django.core.management.base import BaseCommand, CommandError

from payments.reconciliation import reconcile, record_reconcile_result


class Command(BaseCommand):
    help = (
        "Reconcile payments with the ledger: exactly one matching transfer per EXECUTED payment and none "
        "otherwise, balances that sum to zero and match their entries, no negative user balance, no stuck "
        "lease or stalled sweep, and a history consistent with each status. Exit 0 when clean, 1 otherwise."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
        parser.add_argument(
            "--stuck-after", type=float, default=None, metavar="SECONDS",
            help="an EXECUTING lease expired longer than this is stuck (default DELAYPAY_RECONCILE_STUCK_SECONDS)",
        )
        parser.add_argument(
            "--overdue-after", type=float, default=None, metavar="SECONDS",
            help="a SCHEDULED payment overdue longer than this means the sweep stalled "
            "(default DELAYPAY_RECONCILE_OVERDUE_SECONDS)",
        )
        parser.add_argument("--limit", type=int, default=20, help="sample ids shown per violated check (default 20)")

    def handle(self, *args, **options):
        report = reconcile(
            stuck_after_seconds=options["stuck_after"],
            overdue_after_seconds=options["overdue_after"],
            sample_limit=options["limit"],
        )
        record_reconcile_result(violations=report.violations)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        else:
            for check in report.checks:
                mark = "ok  " if check.ok else "FAIL"
                self.stdout.write(f"{mark} {check.name}: {check.violations}  ({check.description})")
                for sample in check.samples:
                    self.stdout.write(f"       {sample}")
            summary = (
                f"reconcile: {report.payments} payments, {len(report.checks)} checks, "
                f"{report.violations} violations, {report.seconds:.2f}s"
            )
            self.stdout.write(self.style.SUCCESS(summary) if report.ok else self.style.ERROR(summary))
        if not report.ok:
            raise CommandError(f"{report.violations} invariant violations", returncode=1)
