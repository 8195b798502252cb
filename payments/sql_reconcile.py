"""Every raw SQL statement of the reconciliation (payments/reconciliation.py), and the
snapshot settlement reconciliation reads in (payouts/settlement.py): multi-table
aggregates with FULL JOINs and FILTER clauses that the ORM cannot say, each one
set-based. Beside payments/sql.py, which holds the engine's other statements.

Parameters are psycopg placeholders (``%s`` or ``%(name)s``); each comment says what
the statement expects and why it is shaped as it is.
"""

# ======================================================================================
# Reconciliation (reconciliation.py)
# ======================================================================================

# One snapshot for every check; whole-table hash aggregates in memory instead of
# spilling to disk; no JIT (seconds of compiling for one run); no parallel workers
# (each would build the same hashes).
RECONCILE_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"
RECONCILE_SESSION = (
    "SET LOCAL work_mem = '256MB'",
    "SET LOCAL jit = off",
    "SET LOCAL max_parallel_workers_per_gather = 0",
)
RECONCILE_COUNT = "SELECT now(), count(*) FROM payments_scheduledpayment"


# Payment <-> ledger. The ledger knows keys, not payments: payment transfers are keyed
# by the payment id, whose prefix is "pay_".
RECONCILE_PAYMENT_LEDGER = r"""
WITH j AS (
    SELECT p.id, p.status, p.amount AS p_amount, p.from_account_id, p.to_account_id,
           t.key, t.amount, t.debit_account_id AS debit, t.credit_account_id AS credit
      FROM payments_scheduledpayment p
      FULL JOIN ledger_transfer t ON t.key = p.id
     -- payments_is_archived (migration 0018): in a month that left the database, not missing.
     WHERE p.id IS NOT NULL OR (t.key LIKE 'pay\_%%' AND NOT payments_is_archived(t.key))
), v AS (
    -- A payout's money moves by two-phase transfers (RECONCILE_PAYOUTS), never under its id.
    SELECT 'executed_without_transfer' AS name, id AS subject FROM j
     WHERE status = 'EXECUTED' AND key IS NULL AND to_account_id IS NOT NULL
    UNION ALL
    -- The unique index on key makes this a walk of the index; it only finds something
    -- if that constraint was lost.
    SELECT 'duplicate_transfers', key || ' ' || count(*) || ' transfers'
      FROM ledger_transfer GROUP BY key HAVING count(*) > 1
    UNION ALL
    SELECT DISTINCT 'transfer_mismatch',
           id || ' payment ' || p_amount || ' ' || from_account_id || '->' || to_account_id
              || ', transfer ' || amount || ' ' || debit || '->' || credit
      FROM j
     WHERE status = 'EXECUTED' AND key IS NOT NULL
       AND (amount <> p_amount OR debit <> from_account_id OR credit <> to_account_id)
    UNION ALL
    SELECT DISTINCT 'transfer_without_execution', id || ' ' || status
      FROM j WHERE status IN ('SCHEDULED', 'CANCELLED', 'FAILED', 'NEEDS_REVIEW') AND key IS NOT NULL
    UNION ALL
    SELECT 'transfer_for_missing_payment', key FROM j WHERE id IS NULL
    UNION ALL
    -- An archived month (partitions.archive_month): the ledger's transfers keyed in its id
    -- range are its executed internal payments, as many and as much as it recorded.
    SELECT 'archived_totals', to_char(a.month, 'YYYY-MM') || ' archived ' || a.executed_count || ' transfers of '
              || a.executed_amount || ', ledger ' || l.transfers || ' of ' || l.amount
      FROM payments_archivedpartition a
      CROSS JOIN LATERAL (SELECT count(*) AS transfers, coalesce(sum(amount), 0) AS amount FROM ledger_transfer
                           WHERE key >= a.id_low AND key < a.id_high) l
     WHERE (l.transfers, l.amount) <> (a.executed_count, a.executed_amount)
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""


RECONCILE_LEDGER = """
WITH e AS (
    SELECT account_id, sum(delta) AS net
      FROM (SELECT credit_account_id AS account_id, amount AS delta FROM ledger_transfer
            UNION ALL
            SELECT debit_account_id, -amount FROM ledger_transfer) entries
     GROUP BY account_id
), a AS (
    SELECT acc.id, acc.kind, acc.balance, coalesce(e.net, 0) AS net
      FROM ledger_account acc LEFT JOIN e ON e.account_id = acc.id
), v AS (
    SELECT 'balance_mismatch' AS name, id || ' balance ' || balance || ', entries ' || net AS subject
      FROM a WHERE balance <> net
    UNION ALL
    SELECT 'negative_user_balance', id || ' balance ' || balance FROM a WHERE kind = 'user' AND balance < 0
    UNION ALL
    SELECT 'balance_sum_nonzero', 'sum ' || s FROM (SELECT sum(balance) AS s FROM ledger_account) total WHERE s <> 0
    UNION ALL
    -- Transfers carry no foreign key to their accounts (decision 0014): one per account
    -- that has entries and does not exist.
    SELECT 'transfer_unknown_account', e.account_id || ' net ' || e.net
      FROM e WHERE NOT EXISTS (SELECT 1 FROM ledger_account acc WHERE acc.id = e.account_id)
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""


# Served by the two partial indexes of the sweep.
RECONCILE_LIVENESS = """
WITH v AS (
    SELECT 'stuck_executing' AS name,
           id || ' attempt ' || attempt || ', lease expired '
              || floor(extract(epoch FROM now() - lease_until))::bigint || 's ago' AS subject
      FROM payments_scheduledpayment
     WHERE status = 'EXECUTING' AND lease_until < now() - make_interval(secs => %(stuck)s)
    UNION ALL
    SELECT 'overdue_scheduled',
           id || ' due ' || floor(extract(epoch FROM now() - execute_at))::bigint || 's ago'
      FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND execute_at < now() - make_interval(secs => %(overdue)s)
    UNION ALL
    SELECT 'overdue_scheduled',
           id || ' retry due ' || floor(extract(epoch FROM now() - next_attempt_at))::bigint || 's ago'
      FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NOT NULL
       AND next_attempt_at < now() - make_interval(secs => %(overdue)s)
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""


# The lookup keys (decision 0011): every payment has exactly its row in
# payments_paymentlookup, with the same payer, accounts and due time, and no row is
# there without its payment. One merge of the two tables by primary key.
RECONCILE_LOOKUP = """
WITH v AS (
    SELECT coalesce(p.id, k.payment_id) || CASE WHEN k.payment_id IS NULL THEN ': no lookup row'
                                               WHEN p.id IS NULL THEN ': lookup row without its payment'
                                               ELSE ': lookup row disagrees' END AS subject
      FROM payments_scheduledpayment p
      FULL JOIN payments_paymentlookup k ON k.payment_id = p.id
     WHERE p.id IS NULL OR k.payment_id IS NULL
        OR (p.payer_id, p.from_account_id, p.to_account_id, p.execute_at)
           IS DISTINCT FROM (k.payer_id, k.from_account_id, k.to_account_id, k.execute_at)
)
SELECT 'lookup_keys', count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v HAVING count(*) > 0
"""


# What the writers guarantee, per payment:
# * one "created" event; one "reclaimed" event per attempt after the first, the last one
#   at the payment's attempt (claim and event are one statement); the first claim writes
#   none (decision record 0010), but a payment claimed before that change has its
#   "claimed" event, at attempt 1, and at most one;
# * EXECUTED/FAILED: exactly one executed/failed event, at the final attempt, and an
#   attempt row at the final attempt that says how it ended ("error" when the error
#   path ended it); CANCELLED: one cancelled event, never claimed; SCHEDULED: nothing
#   but "created"; EXECUTING: claimed, not finished;
# * only the final attempt may finish a payment, and at most one attempt moves money.
RECONCILE_HISTORY = """
WITH ev AS (
    SELECT payment_id,
           count(*) FILTER (WHERE kind = 'created') AS created,
           count(*) FILTER (WHERE kind = 'claimed') AS first_claims,
           max(attempt) FILTER (WHERE kind = 'claimed') AS first_claim_attempt,
           count(*) FILTER (WHERE kind = 'reclaimed') AS reclaims,
           max(attempt) FILTER (WHERE kind = 'reclaimed') AS last_reclaim,
           count(*) FILTER (WHERE kind = 'executed') AS executed,
           count(*) FILTER (WHERE kind = 'failed') AS failed,
           count(*) FILTER (WHERE kind = 'cancelled') AS cancelled,
           max(attempt) FILTER (WHERE kind IN ('executed', 'failed')) AS finished_at_attempt
      FROM payments_paymentevent
     GROUP BY payment_id
), at AS (
    -- Per payment, the highest attempt of each outcome; (payment, attempt) is unique, so
    -- the outcome of the final attempt is the one whose highest attempt equals it.
    SELECT payment_id,
           count(*) AS n,
           min(attempt) AS first_attempt,
           max(attempt) AS last_attempt,
           count(*) FILTER (WHERE outcome = 'executed') AS moved,
           count(*) FILTER (WHERE outcome IN ('executed', 'already_applied', 'failed')) AS finishing,
           max(attempt) FILTER (WHERE outcome IN ('executed', 'already_applied', 'failed')) AS last_finishing,
           max(attempt) FILTER (WHERE outcome = 'executed') AS executed_at,
           max(attempt) FILTER (WHERE outcome = 'already_applied') AS already_applied_at,
           max(attempt) FILTER (WHERE outcome = 'failed') AS failed_at,
           max(attempt) FILTER (WHERE outcome = 'error') AS error_at,
           max(attempt) FILTER (WHERE outcome = 'parked') AS parked_at,
           max(attempt) FILTER (WHERE outcome = 'stale') AS stale_at
      FROM payments_executionattempt
     GROUP BY payment_id
), h AS (
    SELECT p.id, p.status, p.attempt,
           concat_ws('; ',
               CASE WHEN coalesce(ev.created, 0) <> 1 THEN coalesce(ev.created, 0) || ' created events' END,
               CASE WHEN coalesce(ev.reclaims, 0) <> greatest(p.attempt - 1, 0)
                         OR (p.attempt > 1 AND ev.last_reclaim IS DISTINCT FROM p.attempt)
                         OR coalesce(ev.first_claims, 0) > least(p.attempt, 1)
                         OR ev.first_claim_attempt <> 1
                    THEN coalesce(ev.first_claims, 0) || ' claimed and ' || coalesce(ev.reclaims, 0)
                         || ' reclaimed events for attempt ' || p.attempt END,
               CASE WHEN p.status = 'EXECUTED' AND (coalesce(ev.executed, 0) <> 1 OR coalesce(ev.failed, 0) <> 0)
                    THEN 'executed with ' || coalesce(ev.executed, 0) || ' executed and '
                         || coalesce(ev.failed, 0) || ' failed events' END,
               CASE WHEN p.status = 'FAILED' AND (coalesce(ev.failed, 0) <> 1 OR coalesce(ev.executed, 0) <> 0)
                    THEN 'failed with ' || coalesce(ev.failed, 0) || ' failed and '
                         || coalesce(ev.executed, 0) || ' executed events' END,
               CASE WHEN p.status IN ('EXECUTED', 'FAILED') AND ev.finished_at_attempt IS DISTINCT FROM p.attempt
                    THEN 'finished by an event of attempt ' || coalesce(ev.finished_at_attempt::text, 'none') END,
               CASE WHEN p.status NOT IN ('EXECUTED', 'FAILED')
                         AND coalesce(ev.executed, 0) + coalesce(ev.failed, 0) > 0
                    THEN p.status || ' with a finishing event' END,
               CASE WHEN (p.status = 'CANCELLED') <> (coalesce(ev.cancelled, 0) = 1)
                         OR coalesce(ev.cancelled, 0) > 1
                    THEN p.status || ' with ' || coalesce(ev.cancelled, 0) || ' cancelled events' END,
               CASE WHEN p.status = 'EXECUTING' AND p.attempt = 0 THEN 'EXECUTING without a claim' END
           ) AS event_problem,
           concat_ws('; ',
               CASE WHEN fin.out_of_range THEN 'attempt rows outside 1..' || p.attempt END,
               CASE WHEN at.moved > 1 THEN at.moved || ' attempts moved money' END,
               CASE WHEN fin.finished_by_old_attempt > 0
                    THEN fin.finished_by_old_attempt || ' earlier attempts finished it' END,
               CASE WHEN p.status = 'EXECUTED'
                         AND fin.final_outcome IS DISTINCT FROM 'executed'
                         AND fin.final_outcome IS DISTINCT FROM 'already_applied'
                         AND fin.final_outcome IS DISTINCT FROM 'error'
                    THEN 'EXECUTED but attempt ' || p.attempt || ' is ' || coalesce(fin.final_outcome, 'missing') END,
               CASE WHEN p.status = 'FAILED'
                         AND fin.final_outcome IS DISTINCT FROM 'failed' AND fin.final_outcome IS DISTINCT FROM 'error'
                         AND fin.final_outcome IS DISTINCT FROM 'parked'
                    THEN 'FAILED but attempt ' || p.attempt || ' is ' || coalesce(fin.final_outcome, 'missing') END,
               CASE WHEN p.status IN ('SCHEDULED', 'CANCELLED', 'NEEDS_REVIEW')
                         AND fin.final_outcome IN ('executed', 'already_applied', 'failed')
                    THEN p.status || ' but attempt ' || p.attempt || ' is ' || fin.final_outcome END,
               CASE WHEN p.status = 'NEEDS_REVIEW'
                         AND fin.final_outcome IS DISTINCT FROM 'parked' AND fin.final_outcome IS DISTINCT FROM 'error'
                    THEN 'NEEDS_REVIEW but attempt ' || p.attempt || ' is '
                         || coalesce(fin.final_outcome, 'missing') END,
               CASE WHEN p.status = 'EXECUTING'
                         AND fin.final_outcome IN ('executed', 'already_applied', 'failed')
                    THEN 'EXECUTING but attempt ' || p.attempt || ' is ' || fin.final_outcome END
           ) AS attempt_problem
      FROM payments_scheduledpayment p
      LEFT JOIN ev ON ev.payment_id = p.id
      LEFT JOIN at ON at.payment_id = p.id
      CROSS JOIN LATERAL (
          SELECT CASE p.attempt WHEN at.executed_at THEN 'executed' WHEN at.already_applied_at THEN 'already_applied'
                                WHEN at.failed_at THEN 'failed' WHEN at.error_at THEN 'error'
                                WHEN at.parked_at THEN 'parked' WHEN at.stale_at THEN 'stale' END AS final_outcome,
                 at.first_attempt < 1 OR at.last_attempt > p.attempt AS out_of_range,
                 at.finishing - CASE WHEN at.last_finishing = p.attempt THEN 1 ELSE 0 END AS finished_by_old_attempt
      ) fin
), v AS (
    SELECT 'event_history' AS name, id || ' ' || status || ': ' || event_problem AS subject
      FROM h WHERE event_problem <> ''
    UNION ALL
    SELECT 'attempt_history', id || ' ' || status || ': ' || attempt_problem FROM h WHERE attempt_problem <> ''
    UNION ALL
    -- Events and attempts carry no foreign key to their payment (migration 0019): one
    -- whose payment does not exist is found here.
    SELECT 'orphan_history', coalesce(ev.payment_id, at.payment_id) || ': '
              || coalesce(ev.n, 0) || ' events, ' || coalesce(at.n, 0) || ' attempts of no payment'
      FROM (SELECT payment_id, count(*) AS n FROM payments_paymentevent GROUP BY payment_id) ev
      FULL JOIN at ON at.payment_id = ev.payment_id
     WHERE NOT EXISTS (SELECT 1 FROM payments_scheduledpayment p WHERE p.id = coalesce(ev.payment_id, at.payment_id))
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""


# The webhook outbox (the webhooks app's triggers write it in the transaction of each
# change, for an owner with an enabled endpoint subscribed to the type: webhooks/0006):
# an EXECUTED, FAILED or CANCELLED payment has at most one event of its terminal type and
# no other terminal one; a payment not (yet) terminal has none. A terminal payment with
# no event is missing one when its owner has an enabled endpoint subscribed to the type
# that has been unchanged (updated_at) since a minute before the payment finished (its
# updated_at: the row is frozen from then on); the minute is room for an endpoint's own
# transaction, committed after the time it records. An endpoint changed since, or
# disabled, or deleted, proves nothing either way. One hash of the outbox's terminal
# events and one of the subscriptions, against one pass over the payments.
RECONCILE_WEBHOOK_EVENTS = """
WITH w AS (
    SELECT payment_id, array_agg(type::text ORDER BY id) AS types
      FROM webhooks_event
     WHERE payment_id IS NOT NULL AND type IN ('payment.executed', 'payment.failed', 'payment.cancelled')
       AND NOT payments_is_archived(payment_id)
     GROUP BY payment_id
), subscribed AS (
    SELECT owner_id, type, min(updated_at) AS since
      FROM (SELECT owner_id, unnest(events)::text AS type, updated_at FROM webhooks_endpoint WHERE enabled) en
     WHERE type IN ('payment.executed', 'payment.failed', 'payment.cancelled')
     GROUP BY 1, 2
), v AS (
    SELECT 'webhook_events' AS name,
           coalesce(p.id, w.payment_id) || ' ' || coalesce(p.status, 'missing') || ': '
              || coalesce(array_to_string(w.types, ','), 'no event') AS subject
      FROM payments_scheduledpayment p
      FULL JOIN w ON w.payment_id = p.id
      LEFT JOIN subscribed s ON s.owner_id = p.payer_id AND s.type = 'payment.' || lower(p.status)
     WHERE CASE WHEN p.status IN ('EXECUTED', 'FAILED', 'CANCELLED')
                THEN CASE WHEN w.types IS NULL THEN s.since < p.updated_at - interval '1 minute'
                          ELSE w.types IS DISTINCT FROM ARRAY['payment.' || lower(p.status)] END
                ELSE w.types IS NOT NULL END
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""

# Payouts and two-phase transfers (ledger_pendingtransfer): each payout's reserve agrees
# with its status (EXECUTED: posted; FAILED or CANCELLED: voided or never reserved; not
# finished: pending or never reserved) and with its record at the rail; every pending row
# has its "pend:" transfer and exactly the "post:" or "void:" transfer its state says; no
# reserve is pending for longer than %(pending)s seconds unless staff hold it in review;
# no payout to a deleted payee is pending, or executed after the payee was deleted
# (payee_delete writes deleted_at after it has counted the pending payouts, so one that
# finished before has an earlier executed_at); each rail's clearing account holds exactly its pending amounts.
RECONCILE_PAYOUTS = r"""
WITH po AS (
    SELECT p.id, p.status, p.amount, p.from_account_id, p.rail, o.state, o.amount AS o_amount,
           t.state AS t_state, t.amount AS t_amount, t.debit_account_id AS t_debit, t.clearing_account_id AS t_clearing
      FROM payments_scheduledpayment p
      LEFT JOIN payments_payout o ON o.payment_id = p.id
      LEFT JOIN ledger_pendingtransfer t ON t.key = p.id
     WHERE p.rail <> ''
), problems AS (
    SELECT id, status, concat_ws('; ',
        CASE WHEN status = 'EXECUTED' AND (state IS DISTINCT FROM 'paid' OR t_state IS DISTINCT FROM 'posted')
             THEN 'executed with payout ' || coalesce(state, 'none') || ', reserve ' || coalesce(t_state, 'none') END,
        CASE WHEN status IN ('FAILED', 'CANCELLED')
                  AND (t_state IN ('pending', 'posted') OR state IN ('paid', 'pending'))
             THEN 'payout ' || coalesce(state, 'none') || ', reserve ' || coalesce(t_state, 'none') END,
        CASE WHEN status IN ('SCHEDULED', 'EXECUTING', 'NEEDS_REVIEW') AND t_state IN ('posted', 'voided')
             THEN 'not finished with its reserve ' || t_state END,
        CASE WHEN (state IS NULL) <> (t_state IS NULL)
             THEN 'payout ' || coalesce(state, 'none') || ' with reserve ' || coalesce(t_state, 'none') END,
        CASE WHEN t_state IS NOT NULL AND (t_amount <> amount OR o_amount <> amount OR t_debit <> from_account_id
                                           OR t_clearing <> 'acc_' || rail || '_clearing')
             THEN 'reserve of ' || t_amount || ' from ' || t_debit || ' to ' || t_clearing END
    ) AS problem FROM po
), legs AS (
    SELECT split_part(key, ':', 2) AS pkey,
           count(*) FILTER (WHERE key LIKE 'pend:%%') AS pend,
           count(*) FILTER (WHERE key LIKE 'post:%%') AS post,
           count(*) FILTER (WHERE key LIKE 'void:%%') AS void
      FROM ledger_transfer WHERE key LIKE 'pend:%%' OR key LIKE 'post:%%' OR key LIKE 'void:%%'
     GROUP BY 1
), v AS (
    SELECT 'payout_ledger' AS name, id || ' ' || status || ': ' || problem AS subject FROM problems WHERE problem <> ''
    UNION ALL
    SELECT 'two_phase_transfers',
           coalesce(t.key, legs.pkey) || ' ' || coalesce(t.state, 'no pending row') || ': pend '
              || coalesce(legs.pend, 0) || ', post ' || coalesce(legs.post, 0) || ', void ' || coalesce(legs.void, 0)
      FROM ledger_pendingtransfer t
      FULL JOIN legs ON legs.pkey = t.key
     WHERE t.key IS NULL OR coalesce(legs.pend, 0) <> 1
        OR coalesce(legs.post, 0) <> CASE WHEN t.state = 'posted' THEN 1 ELSE 0 END
        OR coalesce(legs.void, 0) <> CASE WHEN t.state = 'voided' THEN 1 ELSE 0 END
    UNION ALL
    SELECT 'pending_transfer_stale',
           t.key || ' pending ' || floor(extract(epoch FROM now() - t.created_at))::bigint || 's, payment '
              || coalesce(p.status, 'missing')
      FROM ledger_pendingtransfer t
      LEFT JOIN payments_scheduledpayment p ON p.id = t.key
     WHERE t.state = 'pending' AND t.created_at < now() - make_interval(secs => %(pending)s)
       AND p.status IS DISTINCT FROM 'NEEDS_REVIEW'
    UNION ALL
    SELECT 'payout_to_deleted_payee',
           p.id || ' ' || p.status || ' to ' || e.id || ' deleted '
              || to_char(e.deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
      FROM payments_payee e
      JOIN payments_scheduledpayment p ON p.to_payee_id = e.id
     WHERE e.deleted_at IS NOT NULL
       AND (p.status IN ('SCHEDULED', 'EXECUTING', 'NEEDS_REVIEW')
            OR (p.status = 'EXECUTED' AND p.executed_at >= e.deleted_at))
    UNION ALL
    SELECT 'clearing_mismatch', a.id || ' balance ' || a.balance || ', pending ' || coalesce(s.total, 0)
      FROM ledger_account a
      LEFT JOIN (SELECT clearing_account_id, sum(amount) AS total FROM ledger_pendingtransfer
                  WHERE state = 'pending' GROUP BY 1) s ON s.clearing_account_id = a.id
     WHERE a.kind = 'system' AND a.id LIKE 'acc\_%%\_clearing' AND a.balance <> coalesce(s.total, 0)
)
SELECT name, count(*), (array_agg(subject ORDER BY subject))[1:%(limit)s] FROM v GROUP BY name
"""
