"""The schedule's partitions and their archival (docs/decisions/0009-partitions-by-payment-id.md).

Payments, their lookup keys, their events, their attempts and their payouts are
range-partitioned by the payment id (``payments_scheduledpayment.id``, the others'
``payment_id``). The id is a ULID: its first ten characters are the creation time in
milliseconds, so a range of ids is a range of creation times, and one month's partition of each table holds the whole
history of the payments created that month. The primary key and every foreign key keep
working (each includes the partition key), and a month leaves as a unit: its five
partitions are exported, checked and detached, with no DELETE and so no trigger to lift
(terminal rows stay frozen).

A ``_default`` partition takes an id no month covers (another id format, or a clock
months off); it should stay empty, and a gauge and an alert say when it is not.

Partitions are created ``DELAYPAY_PARTITIONS_AHEAD_MONTHS`` ahead by a beat task
(``payments.tasks.ensure_partitions``); archival (``archive_due_months``) runs daily
when ``DELAYPAY_RETENTION_DAYS`` is set.
"""

import csv
import gzip
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from common.ids import _ALPHABET

logger = logging.getLogger(__name__)

PAYMENTS = "payments_scheduledpayment"
# Each table and its primary key's columns (the partition key first: the archive's row
# order), in the order a month's partitions are detached (those referencing payments first).
TABLES = {
    "payments_paymentlookup": "payment_id",  # the lookup keys (decision 0011): derived, archived for completeness
    "payments_paymentevent": "payment_id, id",
    "payments_executionattempt": "payment_id, attempt",
    "payments_payout": "payment_id",
    PAYMENTS: "id",
}
PREFIX = "pay_"
# The claim shards' hash (sql.SHARD_HASH): each payments partition carries the statistics
# object migration 0016 made for the table, or the planner misjudges a shard's share of
# the due rows in that partition (test_claim_shards).
SHARD_STATISTICS = "CREATE STATISTICS IF NOT EXISTS {name}_shard ON (hashtext(id) & 2147483647) FROM {name}"
ARCHIVE_FORMAT = "delaypay-partition-archive/1"
# Making a partition and detaching one take the parent tables' ACCESS EXCLUSIVE lock; while
# one waits for it, every claim and batch queues behind it. Never for more than this: the
# hourly and daily tasks try again.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


def month_of(moment: datetime) -> datetime:
    """The first instant of ``moment``'s month, UTC."""
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def add_months(month: datetime, count: int) -> datetime:
    index = month.year * 12 + month.month - 1 + count
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def id_bound(moment: datetime) -> str:
    """The smallest payment id a ULID made at ``moment`` can have: every id made at or
    after it sorts at or above this string, every id made before it below."""
    value = int(moment.timestamp() * 1000)
    chars = []
    for _ in range(10):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return PREFIX + "".join(reversed(chars)) + "0" * 16


def partition_name(table: str, month: datetime) -> str:
    return f"{table}_p{month:%Y%m}"


def default_name(table: str) -> str:
    return f"{table}_default"


@dataclass(frozen=True)
class Month:
    """One month of the schedule: the ids made in [start, end)."""

    start: datetime

    @property
    def end(self) -> datetime:
        return add_months(self.start, 1)

    @property
    def low(self) -> str:
        return id_bound(self.start)

    @property
    def high(self) -> str:
        return id_bound(self.end)

    @property
    def label(self) -> str:
        return f"{self.start:%Y-%m}"

    def name(self, table: str = PAYMENTS) -> str:
        return partition_name(table, self.start)

    @classmethod
    def parse(cls, label: str) -> "Month":
        return cls(datetime.strptime(label, "%Y-%m").replace(tzinfo=UTC))


def create_month(cur, month: Month, tables=TABLES) -> bool:
    """Create ``month``'s partition of every partitioned table (of ``tables``: a migration
    names those that exist at its point); False when the payments' partition exists."""
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", [month.name()])
    if cur.fetchone()[0]:
        return False
    for table in tables:
        # Bounds are literals: DDL takes no parameters. They are built from a date.
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {month.name(table)} PARTITION OF {table} "
            f"FOR VALUES FROM ('{month.low}') TO ('{month.high}')"
        )
    cur.execute(SHARD_STATISTICS.format(name=month.name()))
    return True


def existing_months() -> list[Month]:
    """The months that have a partition, oldest first."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = %s::regclass AND c.relname ~ '_p[0-9]{6}$'
            """,
            [PAYMENTS],
        )
        names = sorted(row[0] for row in cur.fetchall())
    return [Month(datetime.strptime(name[-6:], "%Y%m").replace(tzinfo=UTC)) for name in names]


def ensure_partitions(*, ahead: int | None = None, now: datetime | None = None) -> list[str]:
    """Create the partitions of this month and the next ``ahead`` months that are missing
    (DELAYPAY_PARTITIONS_AHEAD_MONTHS). Returns the labels of the months created. A
    partition whose range holds rows in the default partition cannot be created: that
    month is skipped with an error logged (the default-partition alert is already firing)."""
    ahead = settings.DELAYPAY_PARTITIONS_AHEAD_MONTHS if ahead is None else ahead
    first = month_of(now or timezone.now())
    created = []
    for offset in range(ahead + 1):
        month = Month(add_months(first, offset))
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(LOCK_TIMEOUT)
                if create_month(cur, month):
                    created.append(month.label)
        except DatabaseError as exc:  # rows of the month in the default partition, or the lock not had
            logger.error("partition not created", extra={"month": month.label, "error": str(exc)[:300]})
    if created:
        logger.info("partitions created", extra={"months": created})
    return created


def partition_state() -> dict:
    """What the metrics and the admin show: months present, how far ahead the last one
    reaches, and the rows in each table's default partition."""
    months = existing_months()
    now = timezone.now()
    covered_until = months[-1].end if months else None
    default_rows = {}
    with connection.cursor() as cur:
        for table in TABLES:
            # Bounded: an alert needs to know "some", not how many millions.
            cur.execute(DEFAULT_ROWS_TEMPLATE.format(partition=default_name(table)))
            default_rows[table] = cur.fetchone()[0]
    return {
        "months": [m.label for m in months],
        "ahead_seconds": (covered_until - now).total_seconds() if covered_until else float("-inf"),
        "default_rows": default_rows,
    }


# --- archival ---------------------------------------------------------------------------


class NotArchivable(Exception):
    """The month still holds a payment that is not finished, or finished too recently."""


def archive_cutoff(now: datetime | None = None, *, days: int | None = None) -> datetime | None:
    """Now minus the retention (``days``, else DELAYPAY_RETENTION_DAYS); None when it is 0."""
    days = settings.DELAYPAY_RETENTION_DAYS if days is None else days
    if not days:
        return None
    return (now or timezone.now()) - timedelta(days=days)


HOLDOUTS_TEMPLATE = """
SELECT count(*) FILTER (WHERE status NOT IN ('EXECUTED', 'FAILED', 'CANCELLED')),
       count(*) FILTER (WHERE status IN ('EXECUTED', 'FAILED', 'CANCELLED') AND updated_at >= %s)
  FROM {partition}
"""
TOTALS_TEMPLATE = """
SELECT count(*), count(*) FILTER (WHERE status = 'EXECUTED' AND to_account_id IS NOT NULL),
       coalesce(sum(amount) FILTER (WHERE status = 'EXECUTED' AND to_account_id IS NOT NULL), 0)::bigint
  FROM {partition}
"""
COUNT_TEMPLATE = "SELECT count(*) FROM {partition}"
DEFAULT_ROWS_TEMPLATE = "SELECT count(*) FROM (SELECT 1 FROM {partition} LIMIT 10000) d"
EXPORT_TEMPLATE = "COPY (SELECT * FROM {partition} ORDER BY {order}) TO STDOUT WITH (FORMAT csv, HEADER true)"


def holdouts(month: Month, cutoff: datetime) -> dict:
    """Why ``month`` cannot leave yet: its payments not terminal, and its terminal ones
    that finished after ``cutoff``. Both zero: it can be archived."""
    with connection.cursor() as cur:
        cur.execute(HOLDOUTS_TEMPLATE.format(partition=month.name()), [cutoff])
        pending, recent = cur.fetchone()
    return {"pending": pending, "recent": recent}


def _export(cur, table: str, month: Month, order: str, directory: Path) -> dict:
    """Write one partition as gzipped CSV (PostgreSQL's CSV, with a header) in primary-key
    order; return its entry in the manifest: file, rows, SHA-256 of the CSV text."""
    path = directory / f"{table}.csv.gz"
    digest = hashlib.sha256()
    cur.execute(COUNT_TEMPLATE.format(partition=month.name(table)))
    rows = cur.fetchone()[0]
    query = EXPORT_TEMPLATE.format(partition=month.name(table), order=order)
    with gzip.open(path, "wb", compresslevel=6) as out, cur.cursor.copy(query) as copy:
        for chunk in copy:
            data = bytes(chunk)
            digest.update(data)
            out.write(data)
    with open(path, "rb") as written:
        os.fsync(written.fileno())
    return {"file": path.name, "rows": rows, "sha256": digest.hexdigest()}


def verify_archive(directory: Path) -> dict:
    """Read an archive back: every file's CSV must hash to the manifest's SHA-256 and
    hold its count of records. Returns the manifest; raises ValueError on a difference."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for table, entry in manifest["tables"].items():
        digest = hashlib.sha256()
        with gzip.open(directory / entry["file"], "rb") as data:
            for block in iter(lambda data=data: data.read(1 << 20), b""):
                digest.update(block)
        with gzip.open(directory / entry["file"], "rt", newline="") as text:
            records = sum(1 for _ in csv.reader(text)) - 1  # a quoted field may hold newlines
        if digest.hexdigest() != entry["sha256"] or records != entry["rows"]:
            raise ValueError(f"{directory.name}: {table} does not match its manifest")
    return manifest


def archive_month(month: Month, *, cutoff: datetime, directory: Path | None = None):
    """Export ``month``'s five partitions, check the files against what the database
    holds, then detach and drop the partitions and record the archive. Refuses
    (NotArchivable) while the month holds a payment not terminal or finished after
    ``cutoff``. The export is read in one snapshot; the detach re-counts under the
    tables' locks and gives up if anything changed."""
    from .models import ArchivedPartition

    target = Path(directory or settings.DELAYPAY_ARCHIVE_DIR) / month.name()
    done = False
    try:
        archived = _archive(month, cutoff, target)
        done = True
    finally:
        if not done and target.is_dir() and not ArchivedPartition.objects.filter(
                month=month.start.date()).exists():
            shutil.rmtree(target)  # no half archive left to be mistaken for one
    logger.info("partition archived", extra={"month": month.label, "payments": archived.payments,
                                             "location": str(target), **archived.timings})
    return archived


def _archive(month: Month, cutoff: datetime, target: Path):
    from .models import ArchivedPartition

    with transaction.atomic(), connection.cursor() as cur:
        # Deferred foreign-key checks pending in an enclosing transaction would forbid the
        # DROP; checked now instead (none are pending in the beat task's own transaction).
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('delaypay:archive'))")
        if ArchivedPartition.objects.filter(month=month.start.date()).exists():
            raise NotArchivable(f"{month.label} is archived already")
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [month.name()])
        if not cur.fetchone()[0]:
            raise NotArchivable(f"{month.label} has no partition")
        held = holdouts(month, cutoff)
        if held["pending"] or held["recent"]:
            raise NotArchivable(
                f"{month.label}: {held['pending']} payments not finished, "
                f"{held['recent']} finished within the retention period"
            )
        cur.execute(TOTALS_TEMPLATE.format(partition=month.name()))
        payments, executed, executed_amount = cur.fetchone()
        target.mkdir(parents=True, exist_ok=True)
        clock = [time.monotonic()]
        tables = {table: _export(cur, table, month, key, target) for table, key in TABLES.items()}
        clock.append(time.monotonic())
        manifest = {
            "format": ARCHIVE_FORMAT,
            "month": month.label,
            "id_range": [month.low, month.high],
            "archived_at": timezone.now().isoformat(),
            "retention_cutoff": cutoff.isoformat(),
            "payments": payments,
            "executed_internal": {"count": executed, "amount": executed_amount},
            "tables": tables,
        }
        (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        verify_archive(target)
        clock.append(time.monotonic())
        # Payments first, as every writer takes them; then detach the referencing tables'
        # partitions first (payments' rows are referenced until those are gone).
        cur.execute(LOCK_TIMEOUT)
        cur.execute(f"LOCK TABLE {', '.join(reversed(TABLES))} IN ACCESS EXCLUSIVE MODE")
        for table, entry in tables.items():
            cur.execute(COUNT_TEMPLATE.format(partition=month.name(table)))
            if cur.fetchone()[0] != entry["rows"]:
                raise NotArchivable(f"{month.label}: {table} changed during the export")
            cur.execute(f"ALTER TABLE {table} DETACH PARTITION {month.name(table)}")
            cur.execute(f"DROP TABLE {month.name(table)}")
        clock.append(time.monotonic())
        archived = ArchivedPartition.objects.create(
            month=month.start.date(), id_low=month.low, id_high=month.high, payments=payments,
            executed_count=executed, executed_amount=executed_amount,
            location=str(target), manifest=manifest,
        )
    # Seconds of each step; "detach" is how long the schedule's tables were locked.
    steps = ("export", "verify", "detach")
    archived.timings = {step: round(b - a, 3) for step, a, b in zip(steps, clock[:-1], clock[1:], strict=True)}
    return archived


def archive_due_months(*, now: datetime | None = None) -> list[str]:
    """Archive every month that ended before the retention cutoff and holds only payments
    finished before it (beat: daily, only with DELAYPAY_RETENTION_DAYS set). A month with
    a payment still pending waits for it: it is reported, never forced."""
    cutoff = archive_cutoff(now)
    if cutoff is None:
        return []
    archived = []
    for month in existing_months():
        if month.end > cutoff:
            break
        try:
            archive_month(month, cutoff=cutoff)
        except NotArchivable as exc:
            logger.info("partition kept", extra={"month": month.label, "reason": str(exc)})
            continue
        archived.append(month.label)
    return archived
