"""Match each rail's settlement report of a day against our payouts; exit 1 on a mismatch,
2 when a rail could not answer."""

import json
from datetime import date

from django.core.management.base import BaseCommand, CommandError

from payouts.settlement import reconcile_settlement, yesterday_utc
from rails.base import RAIL_NAMES, SettlementReportUnavailable


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--date must be YYYY-MM-DD, not {text!r}") from None


class Command(BaseCommand):
    help = (
        "Reconcile payouts with the rails' settlement reports of one UTC day: every payout the rail paid is "
        "EXECUTED here with the same amount, destination and reference, and every payout paid here that day is "
        "in the report. Exit 0 when clean, 1 on a mismatch, 2 when a rail could not answer."
    )

    def add_arguments(self, parser):
        parser.add_argument("--date", type=_day, default=None, metavar="YYYY-MM-DD",
                            help="the UTC day to reconcile (default: yesterday, UTC)")
        parser.add_argument("--rail", choices=RAIL_NAMES, action="append", default=None,
                            help="a rail to reconcile (repeatable; default: every rail)")
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
        parser.add_argument("--limit", type=int, default=20, help="sample keys shown per mismatch kind (default 20)")

    def handle(self, *args, **options):
        day = options["date"] or yesterday_utc()
        rails = list(dict.fromkeys(options["rail"] or RAIL_NAMES))
        reports, unavailable = [], {}
        for rail in rails:
            try:
                reports.append(reconcile_settlement(rail=rail, day=day, sample_limit=options["limit"]))
            except SettlementReportUnavailable as exc:
                unavailable[rail] = str(exc)
                self.stderr.write(f"reconcile_settlement: {rail} unavailable, not checked: {exc}")
        mismatches = sum(report.mismatches for report in reports)
        if options["json"]:
            self.stdout.write(json.dumps({
                "ok": mismatches == 0 and not unavailable,
                "day": day.isoformat(),
                "mismatches": mismatches,
                "reports": [report.as_dict() for report in reports],
                "unavailable": unavailable,
            }))
        else:
            for report in reports:
                self.stdout.write(
                    f"{report.rail} {report.day}: {report.rows_at_rail} rows at the rail, {report.payouts_here} "
                    f"payouts here, {report.matched} matched"
                )
                for kind in report.kinds:
                    mark = "ok  " if kind.ok else "FAIL"
                    self.stdout.write(f"{mark} {kind.kind}: {kind.count}  ({kind.description})")
                    for sample in kind.samples:
                        self.stdout.write(f"       {sample}")
                summary = (
                    f"reconcile_settlement {report.rail} {report.day}: {report.mismatches} mismatches, "
                    f"{report.seconds:.2f}s"
                )
                self.stdout.write(self.style.SUCCESS(summary) if report.ok else self.style.ERROR(summary))
        # A mismatch found is the stronger statement: 1 even if another rail was unavailable.
        if mismatches:
            raise CommandError(f"{mismatches} settlement mismatches", returncode=1)
        if unavailable:
            raise CommandError(f"rail unavailable: {', '.join(unavailable)}", returncode=2)
