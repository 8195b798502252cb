-- The payments app's functions, triggers and statistics objects as they stand after the
-- last migration of payments/migrations/. The migrations keep frozen copies (what each
-- one ran); this file is the current text. A migration that creates, replaces or drops
-- one of these changes this file too: tests/ops/test_schema_sql.py compares every
-- function, trigger and statistics object here with the database's after the migrations,
-- both ways. A trigger on a partitioned table is cloned onto each partition, those made
-- later included (payments/partitions.py); only the parent's is written here. No CHECK
-- constraint is written in raw SQL: the models' CheckConstraints are all there is.

-- The state machine, enforced by the database (0002, 0012): forward-only status, final
-- terminal states, an attempt that never goes back, money fields frozen once claimed,
-- payments never deleted.
CREATE OR REPLACE FUNCTION payments_scheduledpayment_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'payment % cannot be deleted', OLD.id USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status IN ('EXECUTED', 'FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'payment % is % and final', OLD.id, OLD.status USING ERRCODE = 'restrict_violation';
    END IF;
    IF NOT ((OLD.status = 'SCHEDULED' AND NEW.status IN ('SCHEDULED', 'EXECUTING', 'CANCELLED'))
         OR (OLD.status = 'EXECUTING'
             AND NEW.status IN ('EXECUTING', 'EXECUTED', 'FAILED', 'SCHEDULED', 'NEEDS_REVIEW'))
         OR (OLD.status = 'NEEDS_REVIEW'
             AND NEW.status IN ('NEEDS_REVIEW', 'SCHEDULED', 'FAILED', 'CANCELLED'))) THEN
        RAISE EXCEPTION 'payment %: % -> % is not a legal transition', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.attempt < OLD.attempt THEN
        RAISE EXCEPTION 'payment %: attempt may not go back', OLD.id USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.payer_id <> OLD.payer_id OR NEW.created_at <> OLD.created_at
       OR (OLD.status <> 'SCHEDULED' AND (NEW.amount, NEW.from_account_id, NEW.to_account_id, NEW.execute_at)
           IS DISTINCT FROM (OLD.amount, OLD.from_account_id, OLD.to_account_id, OLD.execute_at)) THEN
        RAISE EXCEPTION 'payment %: fields are frozen once claimed', OLD.id USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;

-- The guard's function runs only on an update it refuses: the WHEN holds the function's
-- checks as one condition (0020). Deleting is refused by a trigger of its own.
CREATE TRIGGER payments_scheduledpayment_guard
    BEFORE UPDATE ON payments_scheduledpayment
    FOR EACH ROW WHEN (
    OLD.status IN ('EXECUTED', 'FAILED', 'CANCELLED')
    OR NOT ((OLD.status = 'SCHEDULED' AND NEW.status IN ('SCHEDULED', 'EXECUTING', 'CANCELLED'))
         OR (OLD.status = 'EXECUTING'
             AND NEW.status IN ('EXECUTING', 'EXECUTED', 'FAILED', 'SCHEDULED', 'NEEDS_REVIEW'))
         OR (OLD.status = 'NEEDS_REVIEW'
             AND NEW.status IN ('NEEDS_REVIEW', 'SCHEDULED', 'FAILED', 'CANCELLED')))
    OR NEW.attempt < OLD.attempt
    OR NEW.id <> OLD.id OR NEW.payer_id <> OLD.payer_id OR NEW.created_at <> OLD.created_at
    OR (OLD.status <> 'SCHEDULED' AND (NEW.amount, NEW.from_account_id, NEW.to_account_id, NEW.execute_at)
        IS DISTINCT FROM (OLD.amount, OLD.from_account_id, OLD.to_account_id, OLD.execute_at))
)
    EXECUTE FUNCTION payments_scheduledpayment_guard();

CREATE TRIGGER payments_scheduledpayment_no_delete
    BEFORE DELETE ON payments_scheduledpayment
    FOR EACH ROW EXECUTE FUNCTION payments_scheduledpayment_guard();

-- The audit tables are append-only (0002, 0006); the refusal names the partition tree's
-- root, and the partition in DETAIL (0022).
CREATE OR REPLACE FUNCTION payments_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused',
        COALESCE(pg_partition_root(TG_RELID), TG_RELID)::regclass, TG_OP
        USING ERRCODE = 'restrict_violation', DETAIL = format('The row is in %s.', TG_RELID::regclass);
END $$ LANGUAGE plpgsql;

CREATE TRIGGER payments_paymentevent_append_only
    BEFORE UPDATE OR DELETE ON payments_paymentevent
    FOR EACH ROW EXECUTE FUNCTION payments_append_only();

CREATE TRIGGER payments_executionattempt_append_only
    BEFORE UPDATE OR DELETE ON payments_executionattempt
    FOR EACH ROW EXECUTE FUNCTION payments_append_only();

CREATE TRIGGER payments_recurringevent_append_only
    BEFORE UPDATE OR DELETE ON payments_recurringevent
    FOR EACH ROW EXECUTE FUNCTION payments_append_only();

-- A recurring series is never deleted, and an ended one never changes (0006).
CREATE OR REPLACE FUNCTION payments_recurring_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'recurring payment % cannot be deleted', OLD.id
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status = 'ENDED' THEN
        RAISE EXCEPTION 'recurring payment % has ended', OLD.id USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER payments_recurring_guard
    BEFORE UPDATE OR DELETE ON payments_recurringpayment
    FOR EACH ROW EXECUTE FUNCTION payments_recurring_guard();

-- One live occurrence per (series, slot): a partitioned table cannot hold the unique
-- index, so payments_occurrenceslot does, kept by these two triggers (0018).
CREATE OR REPLACE FUNCTION payments_occurrence_slot() RETURNS trigger LANGUAGE plpgsql AS $$
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

-- 0018 wrote the WHEN as one row comparison; PostgreSQL keeps it as three, and the rebuild
-- of the partitioned table that followed re-created the trigger from that form. The same
-- condition, as the database holds it:
CREATE TRIGGER payments_occurrence_slot_update
    AFTER UPDATE OF recurring_id, occurrence_at, cancelled_by_series ON payments_scheduledpayment
    FOR EACH ROW WHEN (OLD.recurring_id IS DISTINCT FROM NEW.recurring_id
                       OR OLD.occurrence_at IS DISTINCT FROM NEW.occurrence_at
                       OR OLD.cancelled_by_series IS DISTINCT FROM NEW.cancelled_by_series)
    EXECUTE FUNCTION payments_occurrence_slot();

-- Whether a payment id falls in a month that was archived (payments/partitions.py):
-- reconciliation tells an archived payment from a missing one with it (0018). Inlined by
-- the planner.
CREATE OR REPLACE FUNCTION payments_is_archived(payment_id text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM payments_archivedpartition a WHERE payment_id >= a.id_low AND payment_id < a.id_high)
$$;

-- The lookup keys off the hot path (0021, docs/decisions/0011-lookup-keys-off-the-hot-path.md):
-- payments_paymentlookup holds each payment's payer, accounts and due time, kept by a
-- statement trigger on insert and a row trigger on a change of one of the four columns.
CREATE OR REPLACE FUNCTION payments_lookup_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO payments_paymentlookup (payment_id, payer_id, from_account_id, to_account_id, execute_at)
    SELECT id, payer_id, from_account_id, to_account_id, execute_at FROM inserted;
    RETURN NULL;
END
$$;

CREATE TRIGGER payments_lookup_insert AFTER INSERT ON payments_scheduledpayment
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION payments_lookup_insert();

CREATE OR REPLACE FUNCTION payments_lookup_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE payments_paymentlookup
       SET payer_id = NEW.payer_id, from_account_id = NEW.from_account_id,
           to_account_id = NEW.to_account_id, execute_at = NEW.execute_at
     WHERE payment_id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER payments_lookup_update
    AFTER UPDATE OF payer_id, from_account_id, to_account_id, execute_at ON payments_scheduledpayment
    FOR EACH ROW WHEN ((OLD.payer_id, OLD.from_account_id, OLD.to_account_id, OLD.execute_at)
                       IS DISTINCT FROM (NEW.payer_id, NEW.from_account_id, NEW.to_account_id, NEW.execute_at))
    EXECUTE FUNCTION payments_lookup_update();

-- Statistics on the hash a claim shard filters on, so that the planner estimates a
-- shard's share of the due rows (0016; sql.SHARD_HASH). Each partition has its own
-- (partitions.SHARD_STATISTICS, made with the partition), not written here.
CREATE STATISTICS payments_claim_shard_stats ON ((hashtext(id) & 2147483647)) FROM payments_scheduledpayment;
