"""The outbox is filled by the database: statement-level AFTER INSERT triggers on the
payments' audit tables copy every webhook-worthy event into webhooks_event, in the
transaction of the change that causes it (no event without its change, no change
without its event), one set-based INSERT per audit statement (one per executor batch),
with the payment (or series) row as that transaction sees it.

Every code path updates the payment row before it inserts the audit event, so the
snapshot is the row after the change. The kind -> type maps are webhooks/events.py's
(tests/webhooks/test_outbox.py checks the two agree).

History: every payment already terminal gets its terminal event, marked fanned out, so
reconciliation holds from the start and no endpoint receives the past.
"""

from django.db import migrations

TRIGGERS = """
CREATE FUNCTION webhooks_payment_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT CASE e.kind
               WHEN 'executed' THEN 'payment.executed'
               WHEN 'failed' THEN 'payment.failed'
               WHEN 'cancelled' THEN 'payment.cancelled'
               WHEN 'parked' THEN 'payment.needs_review'
               WHEN 'updated' THEN 'payment.rescheduled'
           END,
           p.payer_id, p.id, NULL, p.version, to_jsonb(p), now()
      FROM new_events e
      JOIN payments_scheduledpayment p ON p.id = e.payment_id
     WHERE e.kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')
     ORDER BY e.id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER webhooks_payment_outbox
    AFTER INSERT ON payments_paymentevent
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks_payment_outbox();

CREATE FUNCTION webhooks_recurring_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT 'recurring_payment.' || e.kind, r.payer_id, NULL, r.id, r.version, to_jsonb(r), now()
      FROM new_events e
      JOIN payments_recurringpayment r ON r.id = e.recurring_id
     WHERE e.kind IN ('paused', 'resumed', 'ended')
     ORDER BY e.id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER webhooks_recurring_outbox
    AFTER INSERT ON payments_recurringevent
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks_recurring_outbox();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS webhooks_recurring_outbox ON payments_recurringevent;
DROP FUNCTION IF EXISTS webhooks_recurring_outbox();
DROP TRIGGER IF EXISTS webhooks_payment_outbox ON payments_paymentevent;
DROP FUNCTION IF EXISTS webhooks_payment_outbox();
"""

# After the triggers exist, in the same transaction: a payment finishing concurrently
# either committed before (backfilled) or inserts its event after (the trigger).
BACKFILL = """
INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at, fanned_out_at)
SELECT CASE p.status
           WHEN 'EXECUTED' THEN 'payment.executed'
           WHEN 'FAILED' THEN 'payment.failed'
           ELSE 'payment.cancelled'
       END,
       p.payer_id, p.id, NULL, p.version, to_jsonb(p), coalesce(p.executed_at, p.cancelled_at, p.updated_at), now()
  FROM payments_scheduledpayment p
 WHERE p.status IN ('EXECUTED', 'FAILED', 'CANCELLED')
   AND NOT EXISTS (SELECT 1 FROM webhooks_event w WHERE w.payment_id = p.id)
 ORDER BY p.id
"""


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0001_initial"),
        ("payments", "0013_recurring_history"),
    ]

    operations = [
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
