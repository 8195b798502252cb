"""Every raw SQL statement of the payout executor (payouts/executor.py), each under a name
that says what it does; the engine's statements it shares (the start markers) are in
payments/sql.py.

Parameters are psycopg placeholders (``%s`` or ``%(name)s``); each comment says what
the statement expects and why it is shaped as it is.
"""

# ======================================================================================
# Payouts (executor.py)
# ======================================================================================

# The fence of a payout batch (as LOCK_FENCED), with what the rail call needs: the rail,
# the destination (the one reserved with, else the payee's), the payout's state (NULL: no
# funds reserved yet) and whether its payee is deleted (never while a payout to it is
# pending: payee_delete refuses; read here so that such a payout is not paid all the same).
# An attempt that has recorded its outcome (``unknown``: the payout stays EXECUTING, its
# lease moved to the follow-up) is over: a message of it delivered again is stale, and the
# successor attempt that claims the row when the lease ends looks the payout up. Acted
# on, the redelivery finished the payout under an attempt whose one row says ``unknown``
# (chaos seed 514838: reconciliation's attempt_history).
LOCK_FENCED_PAYOUTS = """
SELECT p.id, p.attempt, p.from_account_id, p.to_account_id, p.amount, p.execute_at, p.claimed_at,
       coalesce(p.execute_at + p.expires_after < now(), false) AS expired, p.tries,
       p.rail, coalesce(o.destination, e.destination), o.state, e.deleted_at IS NOT NULL AS payee_deleted
  FROM payments_scheduledpayment p
  JOIN unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[]) AS m(id, attempt, status)
    ON m.id = p.id AND m.attempt = p.attempt AND m.status = p.status
  JOIN payments_payee e ON e.id = p.to_payee_id
  LEFT JOIN payments_payout o ON o.payment_id = p.id
 WHERE p.id = ANY(%(ids)s::text[])
   AND NOT EXISTS (SELECT 1 FROM payments_executionattempt a WHERE a.payment_id = p.id AND a.attempt = p.attempt)
 ORDER BY p.id
   FOR NO KEY UPDATE OF p
"""

# The payout records of the funds just reserved; %s: payment ids, rails, destinations,
# amounts.
INSERT_PAYOUTS = """
INSERT INTO payments_payout (payment_id, rail, destination, amount, state, reference, decline_code, submissions,
                             lookups, last_error, created_at, updated_at)
SELECT id, rail, destination, amount, 'pending', '', '', 0, 0, '', now(), now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS v(id, rail, destination, amount)
ON CONFLICT (payment_id) DO NOTHING
"""

# What one round of rail calls learnt, per payout: its new state (pending while
# unknown), the rail's reference and time, the decline code, the calls made, the error.
UPDATE_PAYOUTS = """
UPDATE payments_payout o
   SET state = v.state, reference = coalesce(nullif(v.reference, ''), o.reference),
       paid_at = coalesce(v.paid_at, o.paid_at), decline_code = v.decline_code,
       submissions = o.submissions + v.submissions, lookups = o.lookups + v.lookups,
       last_error = v.error, updated_at = now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::text[], %s::int[], %s::int[], %s::text[])
       AS v(id, state, reference, paid_at, decline_code, submissions, lookups, error)
 WHERE o.payment_id = v.id
"""

# An ambiguous answer: the payout stays EXECUTING, its lease moved to the follow-up (the
# next attempt, claimed when the lease runs out, looks it up by key), with an "unknown"
# attempt row and an outcome_unknown event, in one statement.
PAYOUT_FOLLOW_UP = """
WITH v AS (
    SELECT * FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(delays)s::float8[], %(errors)s::text[],
                         %(unsent)s::bool[])
        AS v(id, attempt, delay, error, unsent)
), moved AS (
    -- A call that provably never reached the rail (connection refused) gives its try back:
    -- an unreachable rail delays a payout (its breaker opens), it never parks it.
    UPDATE payments_scheduledpayment p
       SET lease_until = now() + make_interval(secs => v.delay), updated_at = now(),
           tries = CASE WHEN v.unsent THEN greatest(p.tries - 1, 0) ELSE p.tries END
      FROM v
     WHERE p.id = ANY(%(ids)s::text[]) AND p.id = v.id AND p.attempt = v.attempt AND p.status = 'EXECUTING'
 RETURNING p.id, p.attempt, p.lease_until, v.error
), attempts AS (
    INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
    SELECT id, attempt, %(started_at)s, now(), %(worker)s, 'unknown', error FROM moved
    ON CONFLICT (payment_id, attempt) DO NOTHING
)
INSERT INTO payments_paymentevent (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
SELECT id, 'outcome_unknown', 'EXECUTING', 'EXECUTING', attempt, %(actor)s,
       jsonb_build_object('follow_up_at', lease_until, 'error', left(error, 200)), now()
  FROM moved
"""
