"""The naive approach a Celery user reaches for, for the benchmark only.

One ``apply_async(eta=execute_at)`` per payment; the worker holds every message in
memory until it is due, then runs this task, which does the same ledger transfer as
delaypay (``ledger_post_batch``, one posting) and moves the payment's status, one
transaction per payment. No lease, no fence, no audit rows: that is the point.

Not in ``CELERY_TASK_ROUTES`` and never imported by a production process: only the
benchmark's naive worker loads it (``celery worker --include devtools.bench.naive_tasks``).
"""

from celery import shared_task
from django.db import connection, transaction

from ledger.services import Posting, ledger_post_batch

TAKE_SQL = """
UPDATE payments_scheduledpayment
   SET status = 'EXECUTING', attempt = attempt + 1, lease_until = now() + interval '1 minute',
       claimed_at = now(), updated_at = now()
 WHERE id = %s AND status = 'SCHEDULED'
RETURNING from_account_id, to_account_id, amount
"""

FINISH_SQL = """
UPDATE payments_scheduledpayment
   SET status = %s, failure_reason = %s, executed_at = %s, lease_until = NULL, updated_at = now()
 WHERE id = %s AND status = 'EXECUTING'
"""


def naive_pay(payment_id: str) -> str:
    """Execute one payment in its own transaction; its outcome."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(TAKE_SQL, [payment_id])
        row = cur.fetchone()
        if row is None:
            return "skipped"
        result = ledger_post_batch(postings=[Posting(payment_id, row[0], row[1], row[2])])[payment_id]
        if result.outcome.moved:
            cur.execute(FINISH_SQL, ["EXECUTED", "", result.posted_at, payment_id])
        else:
            cur.execute(FINISH_SQL, ["FAILED", result.outcome.value, None, payment_id])
        return result.outcome.value


@shared_task(name="bench.naive_pay", ignore_result=True, acks_late=True)
def naive_pay_task(payment_id: str) -> str:
    return naive_pay(payment_id)
