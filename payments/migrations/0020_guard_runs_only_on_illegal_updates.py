"""The state machine's guard runs only on an update it refuses: the trigger's ``WHEN``
holds the same conditions as the function's checks, so a legal update (every claim and
every finish, two a payment) is decided by one expression evaluated in the executor, not
by a call to PL/pgSQL. An illegal one still calls the function, which raises with the
message it always gave. Deleting stays refused by a trigger of its own (``WHEN`` cannot
name ``NEW`` on a delete). The guard's function is unchanged (migration 0012).

1.7 % of PostgreSQL's CPU in a burst went to the row triggers before an update, the
guard's calls with them (``perf`` of a burst at 10,000 accounts); in the executor's
backend that share fell from about 2.1 % to 1.25 % (docs/explanation/performance.md). tests/payments/test_models.py checks
every transition and every frozen field against the trigger.
"""

from django.db import migrations

# The function's checks (migration 0012's GUARD), as one condition on OLD and NEW.
ILLEGAL_UPDATE = """
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
"""

FORWARD = f"""
DROP TRIGGER payments_scheduledpayment_guard ON payments_scheduledpayment;
CREATE TRIGGER payments_scheduledpayment_guard
    BEFORE UPDATE ON payments_scheduledpayment
    FOR EACH ROW WHEN ({ILLEGAL_UPDATE})
    EXECUTE FUNCTION payments_scheduledpayment_guard();
CREATE TRIGGER payments_scheduledpayment_no_delete
    BEFORE DELETE ON payments_scheduledpayment
    FOR EACH ROW EXECUTE FUNCTION payments_scheduledpayment_guard();
"""

BACKWARD = """
DROP TRIGGER payments_scheduledpayment_no_delete ON payments_scheduledpayment;
DROP TRIGGER payments_scheduledpayment_guard ON payments_scheduledpayment;
CREATE TRIGGER payments_scheduledpayment_guard
    BEFORE UPDATE OR DELETE ON payments_scheduledpayment
    FOR EACH ROW EXECUTE FUNCTION payments_scheduledpayment_guard();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0019_event_indexes_off_the_hot_path"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
