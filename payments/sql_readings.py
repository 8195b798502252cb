"""The read side's raw SQL (payments/selectors.py): the lag, outcome and lateness readings
of /metrics, the health checks and the admin dashboard, the review queue's and the rails'.
Beside payments/sql.py, which holds the engine's statements (claim, execute, schedule),
and payments/sql_reconcile.py, the reconciliation's.

Parameters are psycopg placeholders (``%s`` or ``%(name)s``); each comment says what
the statement expects and why it is shaped as it is.
"""

# ======================================================================================
# Lag and outcome readings (selectors.py: metrics, health, dashboard)
# ======================================================================================

# Overdue SCHEDULED payments: the oldest one's age and how many (payments_due_idx). A retry
# waiting on its ladder is not overdue: it is waiting by design (DELAYPAY_RETRY_DELAYS).
SCHEDULE_LAG = """
SELECT coalesce(extract(epoch FROM now() - min(execute_at)), 0), count(*)
  FROM payments_scheduledpayment WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND execute_at <= now()
"""


# SCHEDULED payments falling due within the next %s seconds: one range of payments_due_idx,
# whose predicate this repeats (delaypay_due_inflow_per_second, payments/scaling.py).
DUE_INFLOW = """
SELECT count(*)
  FROM payments_scheduledpayment
 WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL
   AND execute_at > now() AND execute_at <= now() + make_interval(secs => %s)
"""


# EXECUTING payments with a live lease (in flight) and with an expired one (payments_lease_idx).
# Of the rows SCHEDULE_LAG and LEASE_COUNTS count (overdue, expired leases), the payouts
# of the rails given (%s: an array), per rail: the dashboard ties its lag tiles to a rail
# whose breaker is open. Each branch repeats a partial index's predicate (payments_due_idx,
# payments_lease_idx).
STUCK_PAYOUTS_BY_RAIL = """
SELECT rail, count(*) FILTER (WHERE status = 'SCHEDULED'), count(*) FILTER (WHERE status = 'EXECUTING')
  FROM payments_scheduledpayment
 WHERE rail = ANY(%s)
   AND ((status = 'SCHEDULED' AND next_attempt_at IS NULL AND execute_at <= now())
        OR (status = 'EXECUTING' AND lease_until < now()))
 GROUP BY rail
"""


LEASE_COUNTS = """
SELECT count(*) FILTER (WHERE lease_until >= now()), count(*) FILTER (WHERE lease_until < now())
  FROM payments_scheduledpayment WHERE status = 'EXECUTING'
"""


# SCHEDULED payments due in each of the next %s minutes, zeros included. Each minute is
# one range of payments_due_idx, whose predicate the join repeats (next_attempt_at IS
# NULL: a retry's execute_at is already past, so it never falls in these minutes anyway).
# Without it no partial index applies and the planner walked a whole index per minute
# (965 ms at a million payments; 0.3 ms with it).
DUE_BY_MINUTE = """
SELECT m.minute, count(p.id)
  FROM generate_series(date_trunc('minute', now()),
                       date_trunc('minute', now()) + make_interval(mins => %s - 1),
                       interval '1 minute') AS m(minute)
  LEFT JOIN payments_scheduledpayment p
    ON p.status = 'SCHEDULED' AND p.next_attempt_at IS NULL
   AND p.execute_at >= greatest(m.minute, now()) AND p.execute_at < m.minute + interval '1 minute'
 GROUP BY m.minute ORDER BY m.minute
"""


# Executions and failures (by reason) in the last %s seconds, from the event log.
RECENT_OUTCOMES = """
SELECT kind, coalesce(data->>'failure_reason', ''), count(*)
  FROM payments_paymentevent
 WHERE created_at >= now() - make_interval(secs => %s) AND kind IN ('executed', 'failed')
 GROUP BY 1, 2
"""


# The dashboard's 24 h history (console/dashboard.py). HISTORY_START: the first slot of
# the window, on a slot boundary, ``slots`` slots before the current one (which it
# includes); %(bucket)s: the slot's width in seconds. The two readings take that start
# as a constant and read only the window's events through payments_event_created_brin
# (created_at): the event log is append-only, so the window is the last block ranges of
# each partition.
HISTORY_START = """
SELECT date_bin(make_interval(secs => %(bucket)s), now(), timestamptz '2000-01-01')
       - make_interval(secs => %(bucket)s * (%(slots)s - 1))
"""

# Executed, failed and cancelled payments per slot (each payment has exactly one such event).
OUTCOMES_HISTORY = """
SELECT floor(extract(epoch FROM created_at - %(start)s) / %(bucket)s)::int AS slot, kind, count(*)
  FROM payments_paymentevent
 WHERE created_at >= %(start)s AND kind IN ('executed', 'failed', 'cancelled')
 GROUP BY 1, 2
"""

# Execution lateness (executed_at - execute_at, as the delaypay_execution_lateness_seconds
# histogram) per slot: p50, p99 and how many, over the window's executed events, each
# joined to its payment by primary key.
LATENESS_HISTORY = """
SELECT floor(extract(epoch FROM e.created_at - %(start)s) / %(bucket)s)::int AS slot,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.executed_at - p.execute_at))::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM p.executed_at - p.execute_at))::float8,
       count(*)
  FROM payments_paymentevent e
  JOIN payments_scheduledpayment p ON p.id = e.payment_id
 WHERE e.created_at >= %(start)s AND e.kind = 'executed' AND p.executed_at IS NOT NULL
 GROUP BY 1
"""


# The dashboard's "on time" tile: execution lateness p50, p99 and max of the payments
# executed in the last %(seconds)s seconds, at most the latest %(limit)s of them (a bound
# on the read at any rate: at 1,000 a second five minutes are 300,000 rows).
RECENT_LATENESS = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness)::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness)::float8,
       max(lateness)::float8, count(*)
  FROM (SELECT extract(epoch FROM p.executed_at - p.execute_at) AS lateness
          FROM payments_paymentevent e
          JOIN payments_scheduledpayment p ON p.id = e.payment_id
         WHERE e.kind = 'executed' AND e.created_at >= now() - make_interval(secs => %(seconds)s)
           AND p.executed_at IS NOT NULL
         ORDER BY e.created_at DESC
         LIMIT %(limit)s) recent
"""


# ======================================================================================
# The review queue (selectors.py: /metrics and the admin dashboard)
# ======================================================================================

# How many payments are parked in NEEDS_REVIEW and how long the oldest has waited there:
# updated_at is set when a payment is parked and no write touches a parked row but the
# one that takes it out. Both from the small partial index payments_review_idx.
REVIEW_QUEUE = """
SELECT count(*), coalesce(extract(epoch FROM now() - min(updated_at)), 0)
  FROM payments_scheduledpayment WHERE status = 'NEEDS_REVIEW'
"""


# ======================================================================================
# Rails (selectors.py)
# ======================================================================================

# Each rail's breaker and its payouts pending at the rail (payments_payout_pending_idx).
RAIL_READINGS = """
SELECT r.rail, r.breaker, r.forced, r.opened_at, count(o.payment_id),
       coalesce(extract(epoch FROM now() - min(o.created_at)), 0)::float8
  FROM payments_railstate r
  LEFT JOIN payments_payout o ON o.rail = r.rail AND o.state = 'pending'
 GROUP BY r.rail ORDER BY r.rail
"""
