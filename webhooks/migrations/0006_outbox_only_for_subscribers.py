"""The outbox writes an event only for an owner who has an enabled endpoint subscribed
to its type (docs/decisions/0012-outbox-only-for-subscribers.md).

Until now every webhook-worthy change wrote an event, whoever listened: every payment
that finished inserted a ``webhooks_event`` row and its three index entries in the
executor's transaction, and the fan-out later wrote the row again (``fanned_out_at``),
for the great majority of payers who have no endpoint at all. The row was read by
nothing but the fan-out, which found no endpoint and marked it. In ``bench_executor``
the insert alone took a fifth of the executor's database CPU (211/202 -> 170/158 us a
payment with the trigger disabled).

The triggers now ask, in the same statement, whether the change's owner has an enabled
endpoint whose ``events`` list the type: the fan-out's own condition, asked at the
moment of the change instead of a moment later. An endpoint therefore receives the
events of changes whose statement began after the endpoint (or its last change) was
committed; a change that raced an endpoint's creation may not reach it (as a change made
while an endpoint was disabled never did). The reconciliation's ``webhook_events`` check
follows: a terminal payment needs its event when an endpoint subscribed to the type has
been unchanged since a minute before the payment finished (payments/sql.py).

Each function keeps migration 0005's pinned join methods: one primary-key lookup per
event, and one probe of ``webhooks_endpoint_owner_idx`` per event's owner.
"""

import importlib

from django.db import migrations

_0005 = importlib.import_module("webhooks.migrations.0005_outbox_joins_by_primary_key_lookups")

PINNED = "$$ LANGUAGE plpgsql\nSET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off;"

# The type is computed once per event (the LATERAL) and used twice: the row's type and
# the subscription test.
PAYMENT_OUTBOX = """
CREATE OR REPLACE FUNCTION webhooks_payment_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT t.type, p.payer_id, p.id, NULL, p.version,
           CASE WHEN e.kind IN ('executed', 'failed', 'cancelled') THEN NULL ELSE to_jsonb(p) END,
           now()
      FROM new_events e
      CROSS JOIN LATERAL (
          SELECT CASE e.kind
                     WHEN 'executed' THEN 'payment.executed'
                     WHEN 'failed' THEN 'payment.failed'
                     WHEN 'cancelled' THEN 'payment.cancelled'
                     WHEN 'parked' THEN 'payment.needs_review'
                     WHEN 'updated' THEN 'payment.rescheduled'
                 END AS type
      ) t
      JOIN payments_scheduledpayment p ON p.id = e.payment_id
     WHERE e.kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')
       AND EXISTS (SELECT 1 FROM webhooks_endpoint en
                    WHERE en.owner_id = p.payer_id AND en.enabled AND t.type = ANY(en.events))
     ORDER BY e.id;
    RETURN NULL;
END """ + PINNED + "\n"

RECURRING_OUTBOX = """
CREATE OR REPLACE FUNCTION webhooks_recurring_outbox() RETURNS trigger AS $$
BEGIN
    INSERT INTO webhooks_event (type, owner_id, payment_id, recurring_id, version, snapshot, created_at)
    SELECT 'recurring_payment.' || e.kind, r.payer_id, NULL, r.id, r.version, to_jsonb(r), now()
      FROM new_events e
      JOIN payments_recurringpayment r ON r.id = e.recurring_id
     WHERE e.kind IN ('paused', 'resumed', 'ended')
       AND EXISTS (SELECT 1 FROM webhooks_endpoint en
                    WHERE en.owner_id = r.payer_id AND en.enabled
                      AND 'recurring_payment.' || e.kind = ANY(en.events))
     ORDER BY e.id;
    RETURN NULL;
END """ + PINNED + "\n"


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0005_outbox_joins_by_primary_key_lookups"),
    ]

    operations = [
        # The way back: 0005's functions, an event for every change.
        migrations.RunSQL(PAYMENT_OUTBOX + RECURRING_OUTBOX, _0005.PAYMENT_OUTBOX + _0005.RECURRING_OUTBOX),
    ]
