"""The lookup keys off the hot path (docs/decisions/0011-lookup-keys-off-the-hot-path.md).

The payments table loses its three lookup indexes (payments_payer_idx,
payments_from_account_idx and the to_account foreign key's): their keys never change when
a payment is claimed or finished, but both updates are non-HOT, so each wrote a new entry
into all three, six of the ten entries of a payment's two updates. The keys move, with
the due time, to ``payments_paymentlookup``: one row per payment, partitioned like the
payments (the same bounds, so a month still leaves as a unit), kept by two triggers on the
payments table:

* after each INSERT statement, its new rows (a transition table: one INSERT ... SELECT
  however many payments the statement made; COPY included);
* after an UPDATE that sets one of the four columns to another value (a reschedule; the
  claim and the finish set none of them, so the trigger is not even considered).

TRUNCATE fires no row trigger: whoever truncates the payments (a scratch benchmark's
reset, Django's flush between tests) names this table too.

The table is filled from the payments in this migration's transaction, before its
indexes are built; on a large installation, run it in a maintenance window.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

PAYMENTS = "payments_scheduledpayment"
LOOKUP = "payments_paymentlookup"

TABLE = f"""
CREATE TABLE {LOOKUP} (
    payment_id varchar(40) NOT NULL,
    payer_id integer NOT NULL,
    from_account_id varchar(40) NOT NULL,
    to_account_id varchar(40),
    execute_at timestamptz NOT NULL
) PARTITION BY RANGE (payment_id)
"""

FILL = f"""
INSERT INTO {LOOKUP} (payment_id, payer_id, from_account_id, to_account_id, execute_at)
SELECT id, payer_id, from_account_id, to_account_id, execute_at FROM {PAYMENTS}
"""

INDEXES = f"""
ALTER TABLE {LOOKUP} ADD CONSTRAINT {LOOKUP}_pkey PRIMARY KEY (payment_id);
CREATE INDEX payments_lookup_payer_idx ON {LOOKUP} (payer_id, execute_at, payment_id);
CREATE INDEX payments_lookup_from_idx ON {LOOKUP} (from_account_id, execute_at, payment_id);
CREATE INDEX payments_lookup_to_idx ON {LOOKUP} (to_account_id, execute_at, payment_id)
    WHERE to_account_id IS NOT NULL;
"""

TRIGGERS = f"""
CREATE FUNCTION payments_lookup_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {LOOKUP} (payment_id, payer_id, from_account_id, to_account_id, execute_at)
    SELECT id, payer_id, from_account_id, to_account_id, execute_at FROM inserted;
    RETURN NULL;
END
$$;
CREATE TRIGGER payments_lookup_insert AFTER INSERT ON {PAYMENTS}
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION payments_lookup_insert();
CREATE FUNCTION payments_lookup_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {LOOKUP}
       SET payer_id = NEW.payer_id, from_account_id = NEW.from_account_id,
           to_account_id = NEW.to_account_id, execute_at = NEW.execute_at
     WHERE payment_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER payments_lookup_update
    AFTER UPDATE OF payer_id, from_account_id, to_account_id, execute_at ON {PAYMENTS}
    FOR EACH ROW WHEN ((OLD.payer_id, OLD.from_account_id, OLD.to_account_id, OLD.execute_at)
                       IS DISTINCT FROM (NEW.payer_id, NEW.from_account_id, NEW.to_account_id, NEW.execute_at))
    EXECUTE FUNCTION payments_lookup_update();
"""

DROP_OLD_INDEXES = """
DROP INDEX payments_payer_idx;
DROP INDEX payments_from_account_idx;
DROP INDEX payments_scheduledpayment_to_account_id_8fbecff9;
"""

REVERSE = f"""
DROP TRIGGER payments_lookup_insert ON {PAYMENTS};
DROP TRIGGER payments_lookup_update ON {PAYMENTS};
DROP FUNCTION payments_lookup_insert();
DROP FUNCTION payments_lookup_update();
DROP TABLE {LOOKUP};
CREATE INDEX payments_payer_idx ON {PAYMENTS} (payer_id, execute_at);
CREATE INDEX payments_from_account_idx ON {PAYMENTS} (from_account_id, execute_at);
CREATE INDEX payments_scheduledpayment_to_account_id_8fbecff9 ON {PAYMENTS} (to_account_id);
"""


def partitions(cur):
    """Each partition of the payments table: (its name, its bound as PostgreSQL prints it)."""
    cur.execute(
        """
        SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = %s::regclass ORDER BY c.relname
        """,
        [PAYMENTS],
    )
    return cur.fetchall()


def forward(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(TABLE)
        for name, bound in partitions(cur):
            # The same bounds as the payments' partition (partitions.create_month makes both from now on).
            cur.execute(f"CREATE TABLE {LOOKUP}{name.removeprefix(PAYMENTS)} PARTITION OF {LOOKUP} {bound}")
        cur.execute(FILL)
        cur.execute(INDEXES)
        cur.execute(TRIGGERS)
        cur.execute(DROP_OLD_INDEXES)
        cur.execute(f"ANALYZE {LOOKUP}")


def backward(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(REVERSE)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0006_pending_transfers"),
        ("payments", "0020_guard_runs_only_on_illegal_updates"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.CreateModel(
                    name="PaymentLookup",
                    fields=[
                        ("payment", models.OneToOneField(
                            db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, primary_key=True,
                            related_name="lookup", serialize=False, to="payments.scheduledpayment")),
                        ("execute_at", models.DateTimeField()),
                        ("from_account", models.ForeignKey(
                            db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING,
                            related_name="+", to="ledger.account")),
                        ("payer", models.ForeignKey(
                            db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING,
                            related_name="+", to=settings.AUTH_USER_MODEL)),
                        ("to_account", models.ForeignKey(
                            db_constraint=False, db_index=False, null=True,
                            on_delete=django.db.models.deletion.DO_NOTHING, related_name="+", to="ledger.account")),
                    ],
                    options={
                        "indexes": [
                            models.Index(fields=["payer", "execute_at", "payment"], name="payments_lookup_payer_idx"),
                            models.Index(fields=["from_account", "execute_at", "payment"],
                                         name="payments_lookup_from_idx"),
                            models.Index(condition=models.Q(("to_account__isnull", False)),
                                         fields=["to_account", "execute_at", "payment"], name="payments_lookup_to_idx"),
                        ],
                    },
                ),
                migrations.RemoveIndex(model_name="scheduledpayment", name="payments_from_account_idx"),
                migrations.RemoveIndex(model_name="scheduledpayment", name="payments_payer_idx"),
                migrations.AlterField(
                    model_name="scheduledpayment",
                    name="to_account",
                    field=models.ForeignKey(
                        blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT,
                        related_name="incoming_payments", to="ledger.account"),
                ),
            ],
        ),
    ]
