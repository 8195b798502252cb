-- The webhook outbox's functions and triggers as they stand after the last migration of
-- webhooks/migrations/ (0002 made them; 0003-0006 replaced the functions, 0004 and 0005
-- by editing the text of earlier migrations). The migrations keep frozen copies; this
-- file is the current text. A migration that creates, replaces or drops one of these
-- changes this file too: tests/ops/test_schema_sql.py compares every function and
-- trigger here with the database's after the migrations, both ways, and checks that the
-- kind -> type CASE below says what webhooks/events.py's PAYMENT_KIND_TO_TYPE says.
-- No CHECK constraint is written in raw SQL.

-- A payment's webhook-worthy audit events become outbox rows in the transaction of the
-- change, only for an owner with an enabled endpoint subscribed to the type (0006,
-- docs/decisions/0012-outbox-only-for-subscribers.md). A terminal event carries no
-- snapshot: the frozen row is read at delivery (0003). The join methods are pinned, so
-- the plan is one primary-key lookup per event at any batch and table size (0005).
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
END $$ LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off;

CREATE TRIGGER webhooks_payment_outbox
    AFTER INSERT ON payments_paymentevent
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks_payment_outbox();

-- A series' pause, resume and end, the same way (the type is 'recurring_payment.' || kind).
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
END $$ LANGUAGE plpgsql
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off;

CREATE TRIGGER webhooks_recurring_outbox
    AFTER INSERT ON payments_recurringevent
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks_recurring_outbox();
