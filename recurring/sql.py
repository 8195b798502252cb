"""Every raw SQL statement of the recurring payments (recurring/services.py), each under a
name that says what it does; the engine's statements they share (the lock timeout) are in
payments/sql.py.

Parameters are psycopg placeholders (``%s`` or ``%(name)s``); each comment says what
the statement expects and why it is shaped as it is.
"""

# ======================================================================================
# Recurring payments (series.py)
# ======================================================================================

# One batch of the tick's generation: schedules whose previous occurrence is due, except
# the %(seen)s ones this tick already took (generated, or failed and left for the next
# tick). SKIP LOCKED so concurrent promoters generate disjoint schedules and one a user is
# changing waits for the next tick; NO KEY UPDATE because the id never changes, so the
# occurrences and events inserted for a schedule (KEY SHARE) never wait on it. The
# predicate matches the partial index recurring_generate_idx.
RECURRING_DUE = """
SELECT id FROM payments_recurringpayment
 WHERE status = 'ACTIVE' AND next_occurrence_at IS NOT NULL
   AND (last_occurrence_at IS NULL OR last_occurrence_at <= now())
   AND id <> ALL(%(seen)s::text[])
 ORDER BY next_occurrence_at
 LIMIT %(batch)s
   FOR NO KEY UPDATE SKIP LOCKED
"""

# Within the tick's generation, foreign keys are checked statement by statement instead of
# at commit (Django declares them DEFERRABLE INITIALLY DEFERRED): a key-share lock that
# must be waited for, or a violation, then fails one series' savepoint, not the commit of
# its whole batch.
CONSTRAINTS_IMMEDIATE = "SET CONSTRAINTS ALL IMMEDIATE"

# A series cancels its own occurrences still SCHEDULED (pause, end; a change of terms only
# those not yet due: %(not_yet_due_only)s), marked cancelled_by_series so that their slots
# leave payments_occurrence_unique and may be generated again. A compare-and-set on
# status per row, as CANCEL_PENDING: a claim that locked the row first wins (the lock
# re-reads the row), and then that occurrence runs. Served by payments_recurring_idx.
CANCEL_SERIES_OCCURRENCES = """
WITH pending AS (
    SELECT id FROM payments_scheduledpayment
     WHERE recurring_id = %(recurring)s AND status = 'SCHEDULED'
       AND (NOT %(not_yet_due_only)s OR (execute_at > now() AND next_attempt_at IS NULL))
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE payments_scheduledpayment p
   SET status = 'CANCELLED', cancelled_at = now(), updated_at = now(), version = p.version + 1,
       cancelled_by_series = true
  FROM pending
 WHERE p.id = pending.id
RETURNING p.id, p.occurrence_at
"""
