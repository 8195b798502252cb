"""A terminal payment event (``payment.executed``, ``failed``, ``cancelled``) is written
without a snapshot: the row it would copy is frozen from that transaction on (the
payments' state-machine trigger refuses every change of an EXECUTED, FAILED or CANCELLED
row), so the dispatcher reads the row itself when it delivers and renders the same body.
Every payment that finishes wrote a ``to_jsonb`` copy of its whole row into the outbox, its
largest row (about 1 KB of WAL a payment; docs/explanation/performance.md). Events of
changes that are not final (``needs_review``, ``rescheduled``, the series' events) keep
their snapshot: the row moves on after them. Existing events keep theirs.
"""

from django.db import migrations, models

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
     ORDER BY e.id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

# Migration 0002's function, for the way back.
PAYMENT_OUTBOX_0002 = PAYMENT_OUTBOX.replace(
    "CASE WHEN e.kind IN ('executed', 'failed', 'cancelled') THEN NULL ELSE to_jsonb(p) END", "to_jsonb(p)"
)


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0002_outbox_triggers"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="snapshot",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunSQL(PAYMENT_OUTBOX, PAYMENT_OUTBOX_0002),
    ]
