"""Settlement reconciliation: match the payouts a rail says it paid on one UTC day (its
settlement report) against the payouts we recorded as paid that day.

Our side is the ``Payout`` rows in state ``paid`` whose ``paid_at`` falls on the day
(payments_payout_paid_idx), plus, for every key in the report we do not hold among
them, whatever we hold under that key in any state. ``Payout.paid_at`` is the rail's
time, taken from the rail's own answer (submit or lookup), never our clock: a payout the
rail paid at 23:59:59.9 is in that day's report and paid that day here too, so the two
sides agree on the day by construction, whatever the time between the rail paying and
us hearing of it.

Read-only: the rail is called first, outside any transaction, then the database is read
in one REPEATABLE READ snapshot. Only heartbeats are written: the run's total and its
count of each kind (``record``), from which every web process's /metrics exports
``delaypay_settlement_mismatches`` (payments/selectors.py, ``settlement_last_runs``),
whichever process or host ran it and long after it exited.
"""

import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock

from django.db import connection, transaction

from payments import services, sql_reconcile
from payments.models import Heartbeat, PaymentStatus, Payout, PayoutState, ScheduledPayment
from payments.selectors import SETTLEMENT_MISMATCH_KINDS as KINDS
from rails.base import RAIL_NAMES, SettlementReportUnavailable, SettlementRow
from rails.registry import get_rail

logger = logging.getLogger(__name__)

# Keys looked up per query (the report's keys we do not find among the day's payouts).
_KEY_CHUNK = 5_000


@dataclass(frozen=True)
class MismatchResult:
    kind: str
    description: str
    count: int
    samples: list[str] = field(default_factory=list)  # "<key> <detail>", never a destination

    @property
    def ok(self) -> bool:
        return self.count == 0


@dataclass(frozen=True)
class SettlementReport:
    rail: str
    day: date
    rows_at_rail: int  # rows in the rail's settlement report
    payouts_here: int  # our payouts paid that day
    matched: int  # in both, amount, destination and reference equal
    kinds: list[MismatchResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(kind.ok for kind in self.kinds)

    @property
    def mismatches(self) -> int:
        return sum(kind.count for kind in self.kinds)

    def get(self, kind: str) -> MismatchResult:
        return next(result for result in self.kinds if result.kind == kind)

    def as_dict(self) -> dict:
        return {
            "rail": self.rail,
            "day": self.day.isoformat(),
            "ok": self.ok,
            "mismatches": self.mismatches,
            "rows_at_rail": self.rows_at_rail,
            "payouts_here": self.payouts_here,
            "matched": self.matched,
            "seconds": round(self.seconds, 3),
            "kinds": [{**asdict(kind), "ok": kind.ok} for kind in self.kinds],
        }


@dataclass(frozen=True, slots=True)
class _Ours:
    """What we hold under a key: the payment's status and its payout record, if any."""

    status: str
    state: str | None
    amount: int | None
    destination: str | None
    reference: str | None


class _Found:
    def __init__(self, limit: int):
        self.limit = limit
        self.counts = dict.fromkeys(KINDS, 0)
        self.samples: dict[str, list[str]] = {kind: [] for kind in KINDS}

    def add(self, kind: str, key: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.samples[kind]) < self.limit:
            self.samples[kind].append(f"{key} {detail}")

    def results(self) -> list[MismatchResult]:
        return [MismatchResult(kind, KINDS[kind], self.counts[kind], self.samples[kind]) for kind in KINDS]


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """[start, end) of ``day`` in UTC."""
    start = datetime.combine(day, clock.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _read_ours(*, rail: str, day: date, report_keys: set[str]) -> tuple[dict[str, _Ours], dict[str, _Ours]]:
    """(the payouts paid that day by key, what we hold under the report's other keys),
    from one snapshot."""
    start, end = day_bounds(day)
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:
            with connection.cursor() as cur:
                cur.execute(sql_reconcile.RECONCILE_SNAPSHOT)
        paid = {
            payment_id: _Ours(status, PayoutState.PAID, amount, destination, reference)
            for payment_id, status, amount, destination, reference in Payout.objects.filter(
                rail=rail, state=PayoutState.PAID, paid_at__gte=start, paid_at__lt=end
            ).values_list("payment_id", "payment__status", "amount", "destination", "reference")
        }
        others: dict[str, _Ours] = {}
        missing = sorted(report_keys - paid.keys())
        for i in range(0, len(missing), _KEY_CHUNK):
            rows = ScheduledPayment.objects.filter(pk__in=missing[i : i + _KEY_CHUNK]).values_list(
                "id", "status", "payout__state", "payout__amount", "payout__destination", "payout__reference"
            )
            others.update((row[0], _Ours(*row[1:])) for row in rows)
    return paid, others


def _compare(found: _Found, row: SettlementRow, ours: _Ours) -> bool:
    """Record how ``row`` and our payout differ; True when they agree."""
    agree = True
    if row.amount != ours.amount:
        found.add("amount_mismatch", row.key, f"rail {row.amount}, ours {ours.amount}")
        agree = False
    if row.destination != ours.destination:
        found.add("payee_mismatch", row.key, "the rail's destination differs from the payout's")
        agree = False
    if row.reference != ours.reference:
        found.add("reference_mismatch", row.key, f"rail {row.reference}, ours {ours.reference or '-'}")
        agree = False
    return agree


def reconcile_settlement(*, rail: str, day: date, sample_limit: int = 20) -> SettlementReport:
    """Match ``rail``'s settlement report of ``day`` (UTC) against our payouts, record the
    heartbeats (``record``), log what differs; raises ``SettlementReportUnavailable``."""
    started = time.monotonic()
    rows = get_rail(rail).settlement_report(day=day)  # outside any transaction: a network call
    by_key: dict[str, list[SettlementRow]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    paid, others = _read_ours(rail=rail, day=day, report_keys=set(by_key))
    found = _Found(max(int(sample_limit), 0))
    matched = 0
    for key, key_rows in by_key.items():
        ours = paid.get(key) or others.get(key)
        if ours is None or ours.status != PaymentStatus.EXECUTED or ours.state != PayoutState.PAID:
            for row in key_rows:
                held = "unknown to us" if ours is None else f"{ours.status} (payout {ours.state or 'none'})"
                found.add("paid_at_rail_not_executed", key, f"{held}; rail {row.reference}, amount {row.amount}")
            continue
        # A rail with two paid rows under one key paid twice: the row under our reference
        # (else the first) is compared, every other is money we never executed.
        key_rows.sort(key=lambda r: r.reference != ours.reference)
        if _compare(found, key_rows[0], ours):
            matched += 1
        for extra in key_rows[1:]:
            found.add("paid_at_rail_not_executed", key,
                      f"a second payout under this key; rail {extra.reference}, amount {extra.amount}")
    for key, ours in paid.items():
        if key not in by_key:
            found.add("executed_not_at_rail", key, f"ours {ours.reference}, amount {ours.amount}")
    report = SettlementReport(
        rail=rail, day=day, rows_at_rail=len(rows), payouts_here=len(paid), matched=matched,
        kinds=found.results(), seconds=time.monotonic() - started,
    )
    record(report)
    return report


def record(report: SettlementReport) -> None:
    """Record the run in the database, the rail's total and its count of every kind (0
    included), as heartbeats written in one statement (one ``beat_at``): /metrics reads
    them (``last_runs``). Then the log: an ERROR per kind found (ids and amounts only),
    else one INFO."""
    services.heartbeats_record(values={
        Heartbeat.settlement_name(report.rail): report.mismatches,
        **{Heartbeat.settlement_name(report.rail, result.kind): result.count for result in report.kinds},
    })
    for result in report.kinds:
        if not result.ok:
            logger.error(
                "SETTLEMENT MISMATCH %s %s %s: %d (%s); e.g. %s",
                report.rail, report.day, result.kind, result.count, result.description, ", ".join(result.samples),
            )
    if report.ok:
        logger.info("settlement of %s on %s clean: %d rows, %d matched, %.2fs",
                    report.rail, report.day, report.rows_at_rail, report.matched, report.seconds)


def reconcile_settlement_all(*, day: date, sample_limit: int = 10) -> list[SettlementReport]:
    """Reconcile every rail's settlement of ``day`` (the daily task). Each rail that answers
    is reconciled and recorded even when another does not; then, if any did not, raises
    ``SettlementReportUnavailable`` naming them (the task retries)."""
    reports, unavailable = [], []
    for rail in RAIL_NAMES:
        try:
            reports.append(reconcile_settlement(rail=rail, day=day, sample_limit=sample_limit))
        except SettlementReportUnavailable as exc:
            logger.error("settlement of %s on %s not checked: the rail is unavailable (%s)", rail, day, exc)
            unavailable.append(f"{rail}: {exc}")
    if unavailable:
        raise SettlementReportUnavailable("; ".join(unavailable))
    return reports


def yesterday_utc() -> date:
    """The last closed UTC day: the default day to reconcile."""
    return datetime.now(UTC).date() - timedelta(days=1)
