"""The database enforces the state machine: forward-only status, final terminal
states, an attempt that never goes back, money fields frozen once claimed, payments
never deleted, and append-only audit tables."""

from django.db import migrations

GUARD = """
CREATE OR REPLACE FUNCTION payments_scheduledpayment_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'payment % cannot be deleted', OLD.id USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status IN ('EXECUTED', 'FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'payment % is % and final', OLD.id, OLD.status USING ERRCODE = 'restrict_violation';
    END IF;
    IF NOT ((OLD.status = 'SCHEDULED' AND NEW.status IN ('SCHEDULED', 'EXECUTING', 'CANCELLED'))
         OR (OLD.status = 'EXECUTING' AND NEW.status IN ('EXECUTING', 'EXECUTED', 'FAILED'))) THEN
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

CREATE TRIGGER payments_scheduledpayment_guard
    BEFORE UPDATE OR DELETE ON payments_scheduledpayment
    FOR EACH ROW EXECUTE FUNCTION payments_scheduledpayment_guard();

CREATE OR REPLACE FUNCTION payments_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER payments_paymentevent_append_only
    BEFORE UPDATE OR DELETE ON payments_paymentevent
    FOR EACH ROW EXECUTE FUNCTION payments_append_only();

CREATE TRIGGER payments_executionattempt_append_only
    BEFORE UPDATE OR DELETE ON payments_executionattempt
    FOR EACH ROW EXECUTE FUNCTION payments_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS payments_executionattempt_append_only ON payments_executionattempt;
DROP TRIGGER IF EXISTS payments_paymentevent_append_only ON payments_paymentevent;
DROP FUNCTION IF EXISTS payments_append_only();
DROP TRIGGER IF EXISTS payments_scheduledpayment_guard ON payments_scheduledpayment;
DROP FUNCTION IF EXISTS payments_scheduledpayment_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("payments", "0001_initial")]

    operations = [migrations.RunSQL(GUARD, DROP)]
