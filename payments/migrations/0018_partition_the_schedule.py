# The schedule partitioned by payment id (docs/decisions/0009-partitions-by-payment-id.md,
# payments/partitions.py): payments, their events, attempts and payouts become range-
# partitioned tables, one partition per month of creation (the id is a ULID) plus a
# default, so that a month can leave as a unit (archival) and each month's indexes and
# heap are vacuumed on their own.
#
# PostgreSQL cannot turn a table into a partitioned one: each table is rebuilt. Its
# columns (LIKE), constraints, indexes, triggers and statistics objects are read from the
# catalog, the old table is renamed aside, the partitioned one made under the old name,
# the rows copied, the old table dropped, and everything that referred to it rebuilt
# under the same names, so no later migration or raw SQL sees a difference. Two changes
# the partitioning forces:
#   * a unique index must hold the partition key: the events' and attempts' primary keys
#     become (id, payment_id); lookups by id lead with id as before;
#   * payments_occurrence_unique (recurring, occurrence_at) could not: the slot moves to
#     payments_occurrenceslot, kept by the two triggers below;
#   * events and attempts lose their foreign key to the payment (see the AlterFields).
# The copy runs in the migration's transaction and holds the tables' locks: on a large
# installation, run it in a maintenance window (docs/how-to/run-in-production.md).

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from payments.partitions import SHARD_STATISTICS, Month, add_months, create_month, default_name, month_of

CONVERTED = {
    "payments_scheduledpayment": "id",
    "payments_paymentevent": "payment_id",
    "payments_executionattempt": "payment_id",
    "payments_payout": "payment_id",
}
MONTHS_AHEAD = 3  # the beat task keeps DELAYPAY_PARTITIONS_AHEAD_MONTHS from here on

SLOT_TRIGGERS = """
CREATE FUNCTION payments_occurrence_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.recurring_id IS NOT NULL AND NOT OLD.cancelled_by_series THEN
        DELETE FROM payments_occurrenceslot
         WHERE recurring_id = OLD.recurring_id AND occurrence_at = OLD.occurrence_at AND payment_id = OLD.id;
    END IF;
    IF NEW.recurring_id IS NOT NULL AND NOT NEW.cancelled_by_series THEN
        -- A taken slot raises unique_violation on payments_occurrenceslot_pkey, in the
        -- statement that inserted the occurrence (series.OCCURRENCE_TAKEN).
        INSERT INTO payments_occurrenceslot (recurring_id, occurrence_at, payment_id)
        VALUES (NEW.recurring_id, NEW.occurrence_at, NEW.id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER payments_occurrence_slot_insert AFTER INSERT ON payments_scheduledpayment
    FOR EACH ROW WHEN (NEW.recurring_id IS NOT NULL AND NOT NEW.cancelled_by_series)
    EXECUTE FUNCTION payments_occurrence_slot();
CREATE TRIGGER payments_occurrence_slot_update
    AFTER UPDATE OF recurring_id, occurrence_at, cancelled_by_series ON payments_scheduledpayment
    FOR EACH ROW WHEN ((OLD.recurring_id, OLD.occurrence_at, OLD.cancelled_by_series)
                       IS DISTINCT FROM (NEW.recurring_id, NEW.occurrence_at, NEW.cancelled_by_series))
    EXECUTE FUNCTION payments_occurrence_slot();
-- Whether a payment id falls in a month that was archived (payments/partitions.py):
-- reconciliation tells an archived payment from a missing one with it. Inlined by the planner.
CREATE FUNCTION payments_is_archived(payment_id text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM payments_archivedpartition a WHERE payment_id >= a.id_low AND payment_id < a.id_high)
$$;
INSERT INTO payments_occurrenceslot (recurring_id, occurrence_at, payment_id)
SELECT recurring_id, occurrence_at, id FROM payments_scheduledpayment
 WHERE recurring_id IS NOT NULL AND NOT cancelled_by_series;
"""


def _rows(cur, query, params=()):
    cur.execute(query, params)
    return cur.fetchall()


def _capture(cur, table):
    oid = _rows(cur, "SELECT %s::regclass::oid", [table])[0][0]
    return {
        # Every index of the table; those behind a constraint are rebuilt by the constraint.
        "index_names": [r[0] for r in _rows(cur, """
            SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s
        """, [oid])],
        "indexes": [r[0] for r in _rows(cur, """
            SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
             WHERE i.indrelid = %s AND NOT EXISTS (
                   SELECT 1 FROM pg_constraint k WHERE k.conrelid = i.indrelid AND k.conindid = i.indexrelid)
        """, [oid])],
        "constraints": _rows(cur, """
            SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = %s ORDER BY contype = 'f', conname
        """, [oid]),
        "incoming": _rows(cur, """
            SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
             WHERE contype = 'f' AND confrelid = %s AND NOT conrelid::regclass::text = ANY(%s)
        """, [oid, list(CONVERTED)]),
        "triggers": [r[0] for r in _rows(cur, "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
                                              "WHERE tgrelid = %s AND NOT tgisinternal", [oid])],
        "statistics": [r[0] for r in _rows(cur, "SELECT pg_get_statisticsobjdef(oid) FROM pg_statistic_ext "
                                                "WHERE stxrelid = %s", [oid])],
        "identity": [r[0] for r in _rows(cur, "SELECT attname FROM pg_attribute "
                                              "WHERE attrelid = %s AND attidentity <> ''", [oid])],
    }


def _with_key(definition, key):
    """A primary key or unique constraint's definition, with the partition key added."""
    head, _, columns = definition.partition("(")
    names = [c.strip() for c in columns.rstrip(")").split(",")]
    if key in names:
        return definition
    if head.strip() != "PRIMARY KEY":
        raise RuntimeError(f"unique constraint without the partition key: {definition}")
    return f"PRIMARY KEY ({', '.join([*names, key])})"


def partition_the_schedule(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        captured = {table: _capture(cur, table) for table in CONVERTED}
        aside = {table: f"{table}__unpartitioned" for table in CONVERTED}
        for table, cap in captured.items():
            cur.execute(f"ALTER TABLE {table} RENAME TO {aside[table]}")
            for number, name in enumerate(cap["index_names"]):
                cur.execute(f'ALTER INDEX "{name}" RENAME TO "{table[:40]}__unpartitioned_{number}"')
            for column in cap["identity"]:
                cur.execute("SELECT pg_get_serial_sequence(%s, %s)", [aside[table], column])
                cur.execute(f"ALTER SEQUENCE {cur.fetchone()[0]} RENAME TO {table[:40]}__unpartitioned_seq")
        for table, key in CONVERTED.items():
            cur.execute(
                f"CREATE TABLE {table} (LIKE {aside[table]} INCLUDING DEFAULTS INCLUDING IDENTITY "
                f"INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE ({key})"
            )
            cur.execute(f"CREATE TABLE {default_name(table)} PARTITION OF {table} DEFAULT")
        cur.execute(SHARD_STATISTICS.format(name=default_name("payments_scheduledpayment")))
        # One partition per month from the oldest payment's (when its id is a ULID) to
        # MONTHS_AHEAD months from now; any other id lands in the default partition.
        cur.execute(
            "SELECT (SELECT min(created_at) FROM payments_scheduledpayment__unpartitioned "
            "WHERE id >= 'pay_0' AND id < 'pay_8'), now()"
        )
        oldest, now = cur.fetchone()
        month = month_of(oldest or now)
        while month <= add_months(month_of(now), MONTHS_AHEAD):
            create_month(cur, Month(month), tables=CONVERTED)
            month = add_months(month, 1)
        for table in CONVERTED:
            cur.execute(f"INSERT INTO {table} SELECT * FROM {aside[table]}")  # noqa: S608
        for table in CONVERTED:
            cur.execute(f"DROP TABLE {aside[table]} CASCADE")
        for table, key in CONVERTED.items():
            cap = captured[table]
            for name, kind, definition in cap["constraints"]:
                if kind == "f":
                    continue
                if kind in ("p", "u"):
                    definition = _with_key(definition, key)
                cur.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
            for definition in cap["indexes"]:
                cur.execute(definition)
        for table, cap in captured.items():
            for name, kind, definition in cap["constraints"]:
                if kind == "f":
                    cur.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
            for other, name, definition in cap["incoming"]:
                cur.execute(f'ALTER TABLE {other} ADD CONSTRAINT "{name}" {definition}')
            for definition in cap["triggers"] + cap["statistics"]:
                cur.execute(definition)
            for column in cap["identity"]:
                cur.execute(
                    f"SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max({column}), 0) + 1, false) "
                    f"FROM {table}",  # noqa: S608
                    [table, column],
                )
        for table in CONVERTED:
            cur.execute(f"ANALYZE {table}")


class Migration(migrations.Migration):
    atomic = True

    dependencies = [
        ("payments", "0017_start_markers"),
    ]

    operations = [
        migrations.CreateModel(
            name="ArchivedPartition",
            fields=[
                ("month", models.DateField(primary_key=True, serialize=False)),
                ("id_low", models.CharField(max_length=40)),
                ("id_high", models.CharField(max_length=40)),
                ("payments", models.BigIntegerField()),
                ("executed_count", models.BigIntegerField()),
                ("executed_amount", models.BigIntegerField()),
                ("location", models.TextField()),
                ("manifest", models.JSONField()),
                ("archived_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now(),
                                                     editable=False)),
            ],
            options={"ordering": ["month"]},
        ),
        migrations.CreateModel(
            name="OccurrenceSlot",
            fields=[
                ("pk", models.CompositePrimaryKey("recurring_id", "occurrence_at", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("recurring_id", models.CharField(max_length=40)),
                ("occurrence_at", models.DateTimeField()),
                ("payment_id", models.CharField(max_length=40)),
            ],
        ),
        migrations.RunSQL(SLOT_TRIGGERS, migrations.RunSQL.noop),
        migrations.RemoveConstraint(model_name="scheduledpayment", name="payments_occurrence_unique"),
        # No foreign key from events and attempts to the partitioned payments: PostgreSQL
        # checks one with a plan over every partition, locking each, so every event and
        # attempt inserted cost more with each month kept (decision 0009, measured there).
        migrations.AlterField(
            model_name="executionattempt",
            name="payment",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.PROTECT, related_name="attempts",
                                    to="payments.scheduledpayment"),
        ),
        migrations.AlterField(
            model_name="paymentevent",
            name="payment",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.PROTECT, related_name="events",
                                    to="payments.scheduledpayment"),
        ),
        migrations.RunPython(partition_the_schedule, migrations.RunPython.noop),
    ]
