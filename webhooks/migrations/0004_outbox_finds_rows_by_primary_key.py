"""The outbox triggers find the payment (or series) rows of their events by primary key,
always: ``WHERE p.id = ANY(ARRAY(SELECT ... FROM new_events)) AND p.id = e.payment_id``,
as the claim and the executor's fence do (docs/decisions/0005-fence-by-primary-key.md).

Joined to the transition table alone, the planner priced a probe of each partition's
primary key per event above a sequential scan of the whole table and hashed it: every
executor batch read every payment ever scheduled, to copy the 1,000 it had just
finished (``auto_explain`` of ``bench_executor``: 47 of the statement's 59 ms a batch at
40,000 rows, a fifth of the database's CPU; O(table) per batch, so the larger the
history, the slower every batch, until the planner switched plans). A plpgsql trigger's
plan is also made once per session and kept, whatever the table grows to. With the ids
as an array, the index scan of the events' own rows is the plan at every table size
(tests/webhooks/test_outbox.py, under statistics of a small table).

Nothing else changes: the same rows, the same snapshots.
"""

from django.db import migrations

PAYMENT_OUTBOX = """
CREATE OR REPLACE FUNCTION webhooks_payment_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT CASE e.kind
               WHEN 'executed' THEN 'payment.executed'
               WHEN 'failed' THEN 'payment.failed'
               WHEN 'cancelled' THEN 'payment.cancelled'
               WHEN 'parked' THEN 'payment.needs_review'
               WHEN 'updated' THEN 'payment.rescheduled'
           END,
           p.payer_id, p.id, NULL, p.version,
           CASE WHEN e.kind IN ('executed', 'failed', 'cancelled') THEN NULL ELSE to_jsonb(p) END,
           now()
      FROM new_events e
      JOIN payments_scheduledpayment p ON p.id = e.payment_id
     WHERE e.kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')
       AND p.id = ANY(ARRAY(SELECT payment_id FROM new_events
                             WHERE kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')))
     ORDER BY e.id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

RECURRING_OUTBOX = """
CREATE OR REPLACE FUNCTION webhooks_recurring_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT 'recurring_payment.' || e.kind, r.payer_id, NULL, r.id, r.version, to_jsonb(r), now()
      FROM new_events e
      JOIN payments_recurringpayment r ON r.id = e.recurring_id
     WHERE e.kind IN ('paused', 'resumed', 'ended')
       AND r.id = ANY(ARRAY(SELECT recurring_id FROM new_events WHERE kind IN ('paused', 'resumed', 'ended')))
     ORDER BY e.id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

# The functions before, for the way back (migrations 0003 and 0002).
PAYMENT_BY_KEY = """
       AND p.id = ANY(ARRAY(SELECT payment_id FROM new_events
                             WHERE kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')))"""
RECURRING_BY_KEY = """
       AND r.id = ANY(ARRAY(SELECT recurring_id FROM new_events WHERE kind IN ('paused', 'resumed', 'ended')))"""
PAYMENT_OUTBOX_0003 = PAYMENT_OUTBOX.replace(PAYMENT_BY_KEY, "")
RECURRING_OUTBOX_0002 = RECURRING_OUTBOX.replace(RECURRING_BY_KEY, "")


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0003_terminal_events_read_the_frozen_row"),
    ]

    operations = [
        migrations.RunSQL(PAYMENT_OUTBOX, PAYMENT_OUTBOX_0003),
        migrations.RunSQL(RECURRING_OUTBOX, RECURRING_OUTBOX_0002),
    ]
