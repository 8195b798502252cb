"""The schedule's partitions (payments/partitions.py, migration 0018) and the archival of
a month: layout, months made ahead, ids landing in their month, the occurrence slot the
partitioned table cannot hold as an index, and a month exported, verified, detached and
still reconciled."""

import gzip
import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from common import ids
from payments import partitions
from payments.execution import execute_batch
from payments.models import ArchivedPartition, OccurrenceSlot, ScheduledPayment
from payments.partitions import PAYMENTS, TABLES, Month
from payments.promoter import claim_due
from payments.reconciliation import reconcile
from payments.services import payment_cancel
from recurring import services as series_module
from tests.api import assert_error
from tests.conftest import client_for
from tests.factories import due_payment, funded_account

pytestmark = pytest.mark.django_db

PAST = Month(datetime(2026, 6, 1, tzinfo=UTC))  # months before "now" (2026-12 or later)


def partitions_of(table: str) -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
              FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass
            """,
            [table],
        )
        return dict(cur.fetchall())


def partition_of_row(table: str, column: str, value: str) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", [value])
        return cur.fetchone()[0]


@pytest.fixture
def made_in(monkeypatch):
    """Make ids as if the clock read ``moment`` (ULIDs carry their creation time)."""

    def at(moment: datetime):
        monkeypatch.setattr(ids.time, "time_ns", lambda: int(moment.timestamp() * 1e9))

    yield at


def test_every_table_of_the_schedule_is_partitioned_by_the_payment_id_with_a_default():
    with connection.cursor() as cur:
        for table, order in TABLES.items():
            cur.execute("SELECT pg_get_partkeydef(%s::regclass)", [table])
            key = order.split(",")[0]
            assert cur.fetchone()[0] == f"RANGE ({key})"
            bounds = partitions_of(table)
            assert bounds[partitions.default_name(table)] == "DEFAULT"
            this_month = Month(partitions.month_of(timezone.now()))
            for ahead in range(4):
                month = Month(partitions.add_months(this_month.start, ahead))
                assert bounds[month.name(table)] == f"FOR VALUES FROM ('{month.low}') TO ('{month.high}')"


def test_an_id_sorts_inside_the_month_it_was_made_in(made_in):
    month = Month(datetime(2027, 3, 1, tzinfo=UTC))
    for moment, inside in (
        (month.start, True),
        (month.start - timedelta(milliseconds=1), False),
        (month.end - timedelta(milliseconds=1), True),
        (month.end, False),
        (datetime(2027, 3, 17, 12, 30, tzinfo=UTC), True),
    ):
        made_in(moment)
        for _ in range(20):
            made = ids.new_id("pay")
            assert (month.low <= made < month.high) is inside, (moment, made)


def test_a_payment_and_its_history_live_in_the_partitions_of_its_month():
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=10)
    claim = claim_due(batch=10, lease_seconds=60)
    execute_batch(pairs=claim.fresh)
    month = Month(partitions.month_of(timezone.now()))
    assert partition_of_row(PAYMENTS, "id", payment.id) == month.name(PAYMENTS)
    for table in ("payments_paymentevent", "payments_executionattempt"):
        assert partition_of_row(table, "payment_id", payment.id) == month.name(table)


def test_months_ahead_are_made_once_and_each_payments_partition_gets_the_shard_statistics():
    later = timezone.now() + timedelta(days=400)
    created = partitions.ensure_partitions(ahead=2, now=later)
    assert len(created) == 3
    assert partitions.ensure_partitions(ahead=2, now=later) == []
    month = Month(partitions.month_of(later))
    for table in TABLES:
        assert month.name(table) in partitions_of(table)
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_statistic_ext WHERE stxrelid = %s::regclass", [month.name()])
        assert cur.fetchone() is not None


def test_a_month_whose_ids_already_sit_in_the_default_partition_is_reported_not_half_made(made_in, caplog):
    later = datetime(2029, 5, 10, tzinfo=UTC)
    made_in(later)  # no partition for May 2029 yet: this payment lands in the default
    stray = due_payment(source=funded_account(balance=10), target=funded_account(), amount=1)
    assert partition_of_row(PAYMENTS, "id", stray.id) == partitions.default_name(PAYMENTS)
    assert partitions.partition_state()["default_rows"][PAYMENTS] == 1
    with caplog.at_level(logging.ERROR, logger="payments.partitions"):
        created = partitions.ensure_partitions(ahead=1, now=later)
    assert created == ["2029-06"]  # May is refused, June is made
    assert "partition not created" in caplog.text
    assert Month(datetime(2029, 5, 1, tzinfo=UTC)).name() not in partitions_of(PAYMENTS)
    assert ScheduledPayment.objects.filter(pk=stray.pk).exists()


def test_an_occurrence_slot_is_held_once_and_freed_only_by_its_series():
    from tests.payments.test_series import occurrences, recurring

    source, target = funded_account(balance=100), funded_account()
    series = recurring(source, target)
    (first,) = occurrences(series)  # generated with the series, holding its slot
    at = first.occurrence_at
    assert OccurrenceSlot.objects.get(recurring_id=series.id, occurrence_at=at).payment_id == first.id
    again = {"payer": series.payer, "from_account_id": series.from_account_id,
             "to_account_id": series.to_account_id, "amount": 1, "execute_at": at,
             "recurring_id": series.id, "occurrence_at": at}
    with pytest.raises(IntegrityError) as taken, transaction.atomic():
        ScheduledPayment.objects.create(**again)
    assert taken.value.__cause__.diag.constraint_name == series_module.OCCURRENCE_TAKEN
    series_module.recurring_pause(recurring_id=series.id, actor=series.payer)  # cancels it by the series
    assert not OccurrenceSlot.objects.filter(recurring_id=series.id).exists()
    second = ScheduledPayment.objects.create(**again)  # the series may generate it again
    assert OccurrenceSlot.objects.get(recurring_id=series.id, occurrence_at=at).payment_id == second.id

    other = recurring(source, target)
    (own,) = occurrences(other)
    payment_cancel(payment_id=own.id, actor=other.payer)  # cancelled on its own: the slot stays taken
    assert OccurrenceSlot.objects.get(recurring_id=other.id).payment_id == own.id


@pytest.fixture
def old_month(made_in):
    """A month long past with every kind of finished payment, made while the clock read
    mid-June 2026; and one payment of this month, still scheduled."""
    with connection.cursor() as cur:
        partitions.create_month(cur, PAST)
    a, b, poor = funded_account(balance=1000), funded_account(), funded_account(balance=1)
    made_in(datetime(2026, 6, 15, 9, tzinfo=UTC))
    executed = [due_payment(source=a, target=b, amount=n) for n in (100, 20)]
    failed = due_payment(source=poor, target=b, amount=50)
    cancelled = due_payment(source=a, target=b, amount=1, seconds_ago=-3600)
    payment_cancel(payment_id=cancelled.id, actor=a.owner)
    claim = claim_due(batch=100, lease_seconds=60)
    execute_batch(pairs=claim.fresh)
    made_in(datetime.now(UTC))
    current = due_payment(source=a, target=b, amount=1, seconds_ago=-3600)
    return {"a": a, "executed": executed, "failed": failed, "cancelled": cancelled, "current": current}


def test_a_finished_month_is_exported_verified_detached_and_still_reconciles(old_month, tmp_path):
    assert {p.status for p in ScheduledPayment.objects.filter(pk__lt=PAST.high)} == {
        "EXECUTED", "FAILED", "CANCELLED"}
    done = partitions.archive_month(PAST, cutoff=timezone.now() + timedelta(seconds=1), directory=tmp_path)

    assert (done.payments, done.executed_count, done.executed_amount) == (4, 2, 120)
    for table in TABLES:
        assert PAST.name(table) not in partitions_of(table)
    assert not ScheduledPayment.objects.filter(pk__lt=PAST.high).exists()
    assert ScheduledPayment.objects.filter(pk=old_month["current"].pk).exists()
    manifest = partitions.verify_archive(tmp_path / PAST.name())
    assert manifest["tables"][PAYMENTS]["rows"] == 4
    # Each one's "created", the three outcomes and the cancel (a first claim writes no event).
    assert manifest["tables"]["payments_paymentevent"]["rows"] >= 4 + 3 + 1
    with gzip.open(tmp_path / PAST.name() / f"{PAYMENTS}.csv.gz", "rt") as f:
        header, *rows = f.read().splitlines()
    assert header.split(",")[0] == "id" and sorted(r.split(",")[0] for r in rows) == sorted(
        [p.id for p in old_month["executed"]] + [old_month["failed"].id, old_month["cancelled"].id])

    report = reconcile()  # the transfers of archived payments are neither missing nor unmatched
    assert report.ok, {c.name: c.samples for c in report.checks if not c.ok}

    body = assert_error(client_for(old_month["a"].owner).get(f"/api/v1/payments/{old_month['executed'][0].id}"),
                        410, "payment_archived")
    assert body["archived_month"] == "2026-06"
    with pytest.raises(partitions.NotArchivable, match="archived already"):
        partitions.archive_month(PAST, cutoff=timezone.now(), directory=tmp_path)


def test_reconciliation_catches_an_archived_month_that_disagrees_with_the_ledger(old_month, tmp_path):
    partitions.archive_month(PAST, cutoff=timezone.now() + timedelta(seconds=1), directory=tmp_path)
    ArchivedPartition.objects.filter(month=PAST.start.date()).update(executed_amount=121)
    report = reconcile()
    assert report.get("archived_totals").samples == ["2026-06 archived 2 transfers of 121, ledger 2 of 120"]


def test_a_month_with_a_payment_still_pending_or_finished_recently_stays(old_month, tmp_path, made_in):
    with pytest.raises(partitions.NotArchivable, match="0 payments not finished, 4 finished within"):
        partitions.archive_month(PAST, cutoff=timezone.now() - timedelta(days=1), directory=tmp_path)
    made_in(datetime(2026, 6, 20, tzinfo=UTC))
    due_payment(source=old_month["a"], target=funded_account(), amount=1, seconds_ago=-3600)
    with pytest.raises(partitions.NotArchivable, match="1 payments not finished"):
        partitions.archive_month(PAST, cutoff=timezone.now() + timedelta(seconds=1), directory=tmp_path)
    assert PAST.name() in partitions_of(PAYMENTS)
    assert not ArchivedPartition.objects.exists()
    assert not (tmp_path / PAST.name()).exists()


def test_an_archive_whose_file_changed_does_not_verify(old_month, tmp_path):
    partitions.archive_month(PAST, cutoff=timezone.now() + timedelta(seconds=1), directory=tmp_path)
    target = tmp_path / PAST.name()
    call_command("partitions", "--verify", str(target))
    path = target / "payments_executionattempt.csv.gz"
    with gzip.open(path, "rt") as f:
        text = f.read()
    with gzip.open(path, "wt") as f:
        f.write(text.replace("executed", "failed", 1))
    with pytest.raises(CommandError, match="does not match its manifest"):
        call_command("partitions", "--verify", str(target))
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["format"] == partitions.ARCHIVE_FORMAT and manifest["id_range"] == [PAST.low, PAST.high]


def test_nothing_is_archived_while_retention_is_unset(old_month, settings):
    settings.DELAYPAY_RETENTION_DAYS = 0
    assert partitions.archive_due_months() == []
    settings.DELAYPAY_RETENTION_DAYS = 30
    # June's payments finished today: within 30 days, so the month stays.
    assert partitions.archive_due_months() == []
    assert PAST.name() in partitions_of(PAYMENTS)


def test_the_command_refuses_a_month_inside_retention_and_a_bad_month(settings):
    settings.DELAYPAY_RETENTION_DAYS = 30
    this_month = f"{timezone.now():%Y-%m}"
    with pytest.raises(CommandError, match="within the last 30 days"):
        call_command("partitions", "--archive", this_month)
    with pytest.raises(CommandError, match="YYYY-MM"):
        call_command("partitions", "--archive", "June")


def test_an_archive_that_fails_its_read_back_check_leaves_no_files_and_detaches_nothing(old_month, tmp_path,
                                                                                       monkeypatch):
    def corrupted(directory):
        raise ValueError(f"{directory.name}: payments_paymentevent does not match its manifest")

    monkeypatch.setattr(partitions, "verify_archive", corrupted)
    with pytest.raises(ValueError, match="does not match"):
        partitions.archive_month(PAST, cutoff=timezone.now() + timedelta(seconds=1), directory=tmp_path)
    assert not (tmp_path / PAST.name()).exists()
    assert PAST.name() in partitions_of(PAYMENTS)
    assert ScheduledPayment.objects.filter(pk__lt=PAST.high, pk__gte=PAST.low).count() == 4
    assert not ArchivedPartition.objects.exists()
