"""Every raw SQL statement of the payments engine, each under a name that says what it does.

Raw SQL only where the ORM cannot say it: the claim (UPDATE ... FROM a SKIP LOCKED
select, with its audit insert in the same statement), the executor's set-based fence,
CAS and inserts (``unnest`` of arrays: one round trip per batch), the lag readings on
the sweep's partial indexes. The modules that run them (promoter, execution, services,
selectors, idempotency, limits, fallback) import this module and name the statement they
run. The reconciliation's whole-table checks are in payments/sql_reconcile.py; the
payouts' statements in payouts/sql.py, the series' in recurring/sql.py.

Parameters are psycopg placeholders (``%s`` or ``%(name)s``); each comment says what
the statement expects and why it is shaped as it is.
"""

# ======================================================================================
# Claim (promoter.py)
# ======================================================================================

# The claim's writes, shared by every claim statement (CLAIM_DUE, CLAIM_PAYOUTS_DUE,
# CLAIM_DUE_FAIR): the rows of ``due`` become EXECUTING (attempt + 1: the fence; the
# lease); a claim of a later attempt gets its "reclaimed" event in the same statement (a
# first claim none: decision record 0010). ``due`` names each row's id, status, due_at
# and previous_claimed_at (the claimed_at it had: the superseded claim's). A row whose
# lease expired after a worker started it (its start marker, MARK_STARTED) has that try
# counted here (_STARTED: ``tries``, and ``tried_attempt`` for the "started" column).
# The UPDATE finds its rows by primary key, always: joined to ``due`` alone, the planner
# may hash the whole table to find them (under statistics that see a small table, or
# with sorting priced as the last resort by CLAIM_SESSION): a sequential scan of every
# partition on every claim, O(table) instead of O(batch) (test_execution_plans).
_CLAIM_WRITE = """), claimed AS (
    UPDATE payments_scheduledpayment p
       SET status = 'EXECUTING',
           tries = p.tries + CASE WHEN due.status <> 'EXECUTING' THEN 0 WHEN :started THEN 1 ELSE 0 END,
           tried_attempt = CASE WHEN due.status <> 'EXECUTING' THEN p.tried_attempt
                                WHEN :started THEN p.attempt ELSE p.tried_attempt END,
           attempt = p.attempt + 1,
           lease_until = now() + make_interval(secs => %(lease)s),
           claimed_at = now(),
           next_attempt_at = NULL,
           updated_at = now()
      FROM due
     WHERE p.id = ANY(ARRAY(SELECT id FROM due)) AND p.id = due.id
 RETURNING p.id, p.attempt, due.status AS previous_status, due.due_at, p.execute_at, p.tried_attempt,
           p.from_account_id, due.previous_claimed_at
), audit AS (
    -- A first claim writes no event (decision record 0010): the row's claimed_at says
    -- when, its attempt (1) says it was claimed, and the outcome event follows. A claim
    -- of a later attempt writes "reclaimed" with the time of the claim it supersedes,
    -- which the row is about to forget (claimed_at is the latest claim's).
    INSERT INTO payments_paymentevent
           (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
    SELECT id, 'reclaimed', previous_status, 'EXECUTING', attempt, %(actor)s,
           CASE WHEN previous_claimed_at IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('previous_claimed_at', previous_claimed_at) END,
           now()
      FROM claimed
     WHERE attempt > 1
"""


# A worker started p's current attempt: its marker is there (the row's values before the
# statement's own SET: p.attempt is the attempt that ends).
_STARTED = "EXISTS (SELECT 1 FROM payments_startmarker s WHERE s.payment_id = p.id AND s.attempt = p.attempt)"


_CLAIM_WRITE_SQL = _CLAIM_WRITE.replace(":started", _STARTED)


# Raw SQL because the ORM cannot say UPDATE ... FROM (SELECT ... SKIP LOCKED) RETURNING
# with a data-modifying CTE. Internal payments only (rail = ''): payouts are claimed by
# CLAIM_PAYOUTS_DUE below, paced and behind their rail's breaker. One statement claims,
# fences (attempt + 1), leases, and writes the audit events, so a claim and its record
# commit together.
#
# Fresh and expired rows are two locking CTEs rather than the single "WHERE a OR b" of
# the design card (docs/decisions/0001-claim-two-ctes.md): with OR the planner
# bitmap-scans every due row and sorts them all before LIMIT, which is O(backlog) per
# claim during a burst; each CTE here walks its own partial index in order and stops
# after LIMIT rows.
_CLAIM_TEMPLATE = """
WITH fresh AS (
    SELECT id, status, execute_at AS due_at, claimed_at FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND execute_at <= now()
       AND :fresh_rail AND :shard
     ORDER BY execute_at, id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), retry AS (
    -- Retries whose wait on the ladder is over (payments_retry_idx, few rows).
    SELECT id, status, next_attempt_at AS due_at, claimed_at FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NOT NULL AND next_attempt_at <= now()
       AND :rail AND :shard
     ORDER BY next_attempt_at, id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), expired AS (
    SELECT id, status, lease_until AS due_at, claimed_at FROM payments_scheduledpayment
     WHERE status = 'EXECUTING' AND lease_until < now() AND :rail AND :shard
     ORDER BY lease_until
     LIMIT %(reclaim_batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), due AS (
    -- Expired leases first (they are the oldest work), then retries, then fresh rows;
    -- the whole claim stays within the caller's room under the in-flight cap. Rows
    -- locked above the limit are released at commit, untouched.
    SELECT id, status, due_at, claimed_at AS previous_claimed_at FROM (
        SELECT id, status, due_at, claimed_at, 0 AS rank FROM expired
        UNION ALL SELECT id, status, due_at, claimed_at, 1 FROM retry
        UNION ALL SELECT id, status, due_at, claimed_at, 2 FROM fresh
    ) candidates
    ORDER BY rank
    LIMIT %(batch)s
:claim_write)
-- started: the expired claim had been started by a worker (it crashed or hung mid-way)
-- rather than lost before any worker saw it. from_account_id: the promoter's per-sender
-- fairness counts each sender's fresh rows (promoter.FairWalk).
SELECT id, attempt, previous_status, extract(epoch FROM now() - due_at)::float8 AS lateness,
       previous_status = 'EXECUTING' AND tried_attempt IS NOT DISTINCT FROM attempt - 1 AS started,
       from_account_id
  FROM claimed ORDER BY execute_at, id
"""


# Claim shards (DELAYPAY_CLAIM_SHARDS, promoter.py): with K > 1 the beat sends K ticks a
# period, each claiming only the rows of its shard: the rows whose id hashes into its
# slice [%(shard_low)s, %(shard_high)s) of the non-negative int4 range. Several promoter
# processes then claim side by side. No index is keyed by the hash: the due indexes walk
# as ever and drop the other shards' rows, about K visits per row taken, of rows that are
# due anyway (docs/reference/benchmarks.md#shards). The range form, not a modulo, is what
# the planner can estimate: the statistics object of migration 0016 holds the hash's
# histogram, so the estimate is ~1/K; without it (or with a modulo, which no statistics
# describe) the planner guesses 0.5 %, prices the ordered index walk at 200 entries a row
# and sorts every due row instead: O(backlog) per claim (tests/payments/test_claim_shards.py).
# Which shard a payment falls in only has to agree between the promoters of one moment: a
# tick's message carries its shard and the shard count, so a change of K (or a degraded
# tick, which claims every shard) never leaves a row outside every claim.
SHARD_HASH = "(hashtext(id) & 2147483647)"
_SHARD = f"{SHARD_HASH} >= %(shard_low)s AND {SHARD_HASH} < %(shard_high)s"


def _sharded(statement: str, *, sharded: bool) -> str:
    """``statement`` with its shard filters in place, or without them (fixed fragments)."""
    return statement.replace(":shard", _SHARD) if sharded else statement.replace(" AND :shard", "")


def _claim_for(*, rail: str, fresh_rail: str, sharded: bool = False) -> str:
    """The claim with its rail and shard filters in place (fixed fragments, never input)."""
    return _sharded(
        _CLAIM_TEMPLATE.replace(":claim_write", _CLAIM_WRITE_SQL)
        .replace(":fresh_rail", fresh_rail)
        .replace(":rail", rail),
        sharded=sharded,
    )


CLAIM_DUE = _claim_for(rail="rail = ''", fresh_rail="rail = ''")
# One shard's claim: CLAIM_DUE's parameters and %(shard_low)s, %(shard_high)s.
CLAIM_DUE_SHARD = _claim_for(rail="rail = ''", fresh_rail="rail = ''", sharded=True)

# Set in the claim's transaction, before any claim: the due rows are read in the order
# of their index, never gathered and sorted. The schedule is partitioned by month
# (payments/partitions.py); each partition's due index is in due order and the claim
# merges them (Merge Append). But under statistics that see few due rows (a burst outruns
# autovacuum) the planner prices "every partition's due rows, then sort" as cheap as the
# merge, picks it, and then reads and sorts every due row of the backlog to take 500:
# the fair claim's walk went from 35 ms to 85 ms a claim on a 200-account mesh. Sorting
# is not forbidden (the claimed rows are still sorted for the answer); it is priced as
# the last resort. Set back right after the claim (SET LOCAL would outlive it in a caller's
# transaction); a claim that fails rolls its transaction or savepoint back, and the
# setting with it. Tested by test_execution_plans.
CLAIM_SESSION = "SET LOCAL enable_sort = off"
CLAIM_SESSION_END = "SET LOCAL enable_sort = on"

# The internal claim with per-sender fairness (DELAYPAY_CLAIM_PER_SENDER > 0; promoter.py's
# FairWalk keeps its state between the claims of one tick). Plain due order lets one
# sender with 50,000 payments due at midnight hold every other sender's payment due at
# the same instant behind all of its own. Here:
#
# * walk: at most %(walk)s entries of the due order (payments_due_idx) from the tick's
#   cursor, unlocked. Reading from_account_id visits each entry's heap tuple, so the walk
#   is bounded: a claim never costs more than %(walk)s visits however large the backlog
#   (filtering the hot senders out of an unbounded index scan visits all their rows: 18 ms
#   for 50,000 of them, on every claim; docs/reference/benchmarks.md#fairness). The cursor
#   (%(after_at)s, %(after_id)s) moves the next claim's walk past what this one saw, so a
#   tick (or a walk handed from tick to tick, promoter.FAIR_CARRY_SECONDS) walks each
#   stretch of the due order once, %(walk)s entries a claim.
# * senders: the hot ones, those the tick already knows (%(hot)s) and those with more than
#   %(cap)s rows in this walk; at most %(max_hot)s of them.
# * fresh: the walk's rows of every other sender, in due order, locked one by one with
#   SKIP LOCKED (a row another promoter holds is passed over; one that changed since the
#   walk's snapshot is re-checked and dropped), at most %(batch)s - %(cap)s per hot sender.
# * hot: each hot sender's oldest due rows from payments_sender_due_idx, %(cap)s of them,
#   or an equal share of whatever room the fresh rows left: once the other senders are
#   served the hot sender drains at the full batch (no burst rate lost to the cap).
# * expired and retry as in CLAIM_DUE, first; then one UPDATE and one audit insert.
#
# Every row comes back with the walk's summary (a single summary row, id NULL, when
# nothing was claimed): how many entries it saw and the last one, the last fresh row
# taken, the fresh limit, and the hot senders that still had rows.
_CLAIM_DUE_FAIR_TEMPLATE = """
WITH walk AS MATERIALIZED (
    SELECT id, from_account_id, execute_at FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND execute_at <= now() AND rail = ''
       AND (execute_at, id) > (%(after_at)s::timestamptz, %(after_id)s::text) AND :shard
     ORDER BY execute_at, id
     LIMIT %(walk)s
), senders AS MATERIALIZED (
    SELECT sender FROM (
        SELECT sender, 0 AS known, 0::bigint AS n FROM unnest(%(hot)s::text[]) AS k(sender)
        UNION ALL
        SELECT from_account_id, 1, count(*) FROM walk GROUP BY from_account_id HAVING count(*) > %(cap)s
    ) s
    GROUP BY sender
    ORDER BY min(known), max(n) DESC, sender
    LIMIT %(max_hot)s
), fresh AS MATERIALIZED (
    -- The walk CTE is read in the order it was written (its ORDER BY): no re-sort.
    SELECT p.id, p.status, p.due_at, p.execute_at, p.from_account_id, p.claimed_at
      FROM walk w
     CROSS JOIN LATERAL (
        SELECT q.id, q.status, q.execute_at AS due_at, q.execute_at, q.from_account_id, q.claimed_at
          FROM payments_scheduledpayment q
         WHERE q.id = w.id AND q.status = 'SCHEDULED' AND q.next_attempt_at IS NULL AND q.execute_at <= now()
           FOR NO KEY UPDATE SKIP LOCKED
     ) p
     WHERE w.from_account_id NOT IN (SELECT sender FROM senders)
     LIMIT %(batch)s - %(cap)s * (SELECT count(*) FROM senders)
), hot AS MATERIALIZED (
    SELECT x.id, x.status, x.due_at, x.execute_at, x.from_account_id, x.claimed_at
      FROM senders h
     CROSS JOIN LATERAL (
        SELECT q.id, q.status, q.execute_at AS due_at, q.execute_at, q.from_account_id, q.claimed_at
          FROM payments_scheduledpayment q
         WHERE q.from_account_id = h.sender AND q.status = 'SCHEDULED' AND q.next_attempt_at IS NULL
           AND q.execute_at <= now() AND q.rail = '' AND :shard
         ORDER BY q.execute_at, q.id
         LIMIT greatest(%(cap)s, (%(batch)s - (SELECT count(*) FROM fresh))
                                 / greatest((SELECT count(*) FROM senders), 1))
           FOR NO KEY UPDATE SKIP LOCKED
     ) x
), retry AS (
    SELECT id, status, next_attempt_at AS due_at, claimed_at FROM payments_scheduledpayment
     WHERE status = 'SCHEDULED' AND next_attempt_at IS NOT NULL AND next_attempt_at <= now() AND rail = '' AND :shard
     ORDER BY next_attempt_at, id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), expired AS (
    SELECT id, status, lease_until AS due_at, claimed_at FROM payments_scheduledpayment
     WHERE status = 'EXECUTING' AND lease_until < now() AND rail = '' AND :shard
     ORDER BY lease_until
     LIMIT %(reclaim_batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), due AS (
    SELECT id, status, due_at, claimed_at AS previous_claimed_at FROM (
        SELECT id, status, due_at, claimed_at, 0 AS rank FROM expired
        UNION ALL SELECT id, status, due_at, claimed_at, 1 FROM retry
        UNION ALL SELECT id, status, due_at, claimed_at, 2 FROM fresh
        UNION ALL SELECT id, status, due_at, claimed_at, 2 FROM hot
    ) candidates
    ORDER BY rank
    LIMIT %(batch)s
:claim_write), summary AS (
    SELECT (SELECT count(*) FROM walk) AS walked,
           last_walk.execute_at AS walk_at, last_walk.id AS walk_id,
           (SELECT count(*) FROM fresh) AS fresh,
           %(batch)s - %(cap)s * (SELECT count(*) FROM senders) AS fresh_limit,
           last_fresh.execute_at AS fresh_at, last_fresh.id AS fresh_id,
           ARRAY(SELECT DISTINCT from_account_id FROM hot) AS hot
      FROM (SELECT 1) one
      -- The last row of each, by position: both are in due order already, and sorting the
      -- walk's ids again costs more than the walk.
      LEFT JOIN (SELECT execute_at, id FROM walk OFFSET greatest((SELECT count(*) FROM walk) - 1, 0)) last_walk ON true
      LEFT JOIN (SELECT execute_at, id FROM fresh OFFSET greatest((SELECT count(*) FROM fresh) - 1, 0)) last_fresh
        ON true
)
SELECT c.id, c.attempt, c.previous_status, extract(epoch FROM now() - c.due_at)::float8 AS lateness,
       c.previous_status = 'EXECUTING' AND c.tried_attempt IS NOT DISTINCT FROM c.attempt - 1 AS started,
       c.from_account_id, s.walked, s.walk_at, s.walk_id, s.fresh, s.fresh_limit, s.fresh_at, s.fresh_id, s.hot
  FROM summary s
  LEFT JOIN claimed c ON true
 ORDER BY c.execute_at, c.id
"""
_CLAIM_DUE_FAIR_WRITES = _CLAIM_DUE_FAIR_TEMPLATE.replace(":claim_write", _CLAIM_WRITE_SQL)
CLAIM_DUE_FAIR = _sharded(_CLAIM_DUE_FAIR_WRITES, sharded=False)
CLAIM_DUE_FAIR_SHARD = _sharded(_CLAIM_DUE_FAIR_WRITES, sharded=True)

# The payouts' claim, one rail at a time (payouts/executor.py): the same statement over
# that rail's rows only, its fresh rows from payments_payout_due_idx. The caller passes
# the rail's allowance (breaker and pacing) as %(batch)s. An EXECUTING payout whose lease
# ran out is either a worker that died mid-flight or an ambiguous answer whose follow-up
# is due: either way the next attempt looks it up at the rail by key first.
CLAIM_PAYOUTS_DUE = _claim_for(rail="rail = %(rail)s", fresh_rail="rail <> '' AND rail = %(rail)s")

# The releaser's claim (payments/release.py): the internal rows that fell due within the
# last %(window)s seconds and after %(after)s (the instant of its last claim that came back
# a whole batch: what was due then is a burst, the ticks' to claim fairly), in due order,
# nothing else. Older rows are the beat ticks'
# backlog (a burst, an outage's leftovers), as are retries and expired leases: the ticks
# claim them, the releaser keeps the rows that fall due now on time beside them. The same
# claim write as every claim (attempt + 1, lease, audit event): a release is a claim.
CLAIM_RELEASE = _claim_for(
    rail="false",
    fresh_rail="rail = '' AND execute_at > greatest(now() - make_interval(secs => %(window)s), %(after)s)",
)

# In the release claim's transaction, after it: the database's now() (the claim's instant)
# and the next instant something falls due after it, internal and payout apart; NULL when
# nothing does within %(horizon)s seconds. Each is the first entry of a due index past
# now() (payments_due_idx, payments_payout_due_idx per rail): a probe, not a scan. The
# claim's own rows are EXECUTING by now and rows other claimers hold are due already, so
# both instants lie strictly ahead.
RELEASE_NEXT_DUE = """
SELECT now(),
       (SELECT execute_at FROM payments_scheduledpayment
         WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND rail = ''
           AND execute_at > now() AND execute_at <= now() + make_interval(secs => %(horizon)s)
         ORDER BY execute_at, id LIMIT 1),
       (SELECT min(due) FROM unnest(%(rails)s::text[]) AS r(name), LATERAL (
            SELECT execute_at AS due FROM payments_scheduledpayment
             WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL AND rail <> '' AND rail = r.name
               AND execute_at > now() AND execute_at <= now() + make_interval(secs => %(horizon)s)
             ORDER BY rail, execute_at, id LIMIT 1) AS first)
"""


# Live leases only. A row whose lease expired is not in flight: its message or worker is
# gone, and it is exactly what the next claim must take again. Counting it would let a
# lost window of messages (Redis restarted with the cap's worth queued) block the
# promoter forever.
# Internal payments only: payouts are bounded by their rail's pacing, and a payout waiting
# for the follow-up of an ambiguous answer must not hold room the internal claim needs.
COUNT_IN_FLIGHT = (
    "SELECT count(*) FROM payments_scheduledpayment WHERE status = 'EXECUTING' AND lease_until >= now()"
    " AND rail = ''"
)


# ======================================================================================
# Execute (execution.py)
# ======================================================================================

# The fence and the CAS find their rows by primary key, always. The expected status
# comes in as a column of the unnest (every element 'EXECUTING') rather than as the
# literal: with the literal the planner may pick the partial lease index, whose
# statistics are stale in a burst (EXECUTING goes from ~0 to tens of thousands of rows
# within seconds, long before autovacuum analyzes), and then every batch scans all
# in-flight rows: O(in-flight) per batch instead of O(batch). ``tries`` here is the
# counted tries plus the current attempt's start (its marker, MARK_STARTED), which the
# CAS counts in the row when the attempt ends (docs/decisions/0008-start-markers-off-the-row.md).
# Internal payments only (rail = ''): a payout's pair that reached this executor (a message
# on the wrong queue) is not its to work; it stays stale here, and INSERT_STALE_ATTEMPTS
# leaves its current attempt to the payouts executor (payouts/executor.py).
_LOCK_FENCED_TEMPLATE = """
SELECT p.id, p.attempt, p.from_account_id, p.to_account_id, p.amount, p.execute_at, p.claimed_at,
       coalesce(p.execute_at + p.expires_after < now(), false) AS expired,
       p.tries + CASE WHEN :started THEN 1 ELSE 0 END AS tries
  FROM payments_scheduledpayment p
  JOIN unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[]) AS m(id, attempt, status)
    ON m.id = p.id AND m.attempt = p.attempt AND m.status = p.status
 WHERE p.id = ANY(%(ids)s::text[]) AND p.rail = ''
 ORDER BY p.id
   FOR NO KEY UPDATE OF p
"""
LOCK_FENCED = _LOCK_FENCED_TEMPLATE.replace(":started", _STARTED)


_FINISH_FENCED_TEMPLATE = """
UPDATE payments_scheduledpayment p
   SET status = v.status, failure_reason = v.reason, executed_at = v.executed_at,
       review_reason = v.review_reason, next_attempt_at = v.next_attempt_at, lease_until = NULL, updated_at = now(),
       tries = p.tries + CASE WHEN :started THEN 1 ELSE 0 END,
       tried_attempt = CASE WHEN :started THEN p.attempt ELSE p.tried_attempt END
  FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[], %(statuses)s::text[],
              %(reasons)s::text[], %(executed_ats)s::timestamptz[], %(review_reasons)s::text[],
              %(next_attempt_ats)s::timestamptz[])
       AS v(id, attempt, expected, status, reason, executed_at, review_reason, next_attempt_at)
 WHERE p.id = ANY(%(ids)s::text[]) AND p.id = v.id AND p.attempt = v.attempt AND p.status = v.expected
"""
FINISH_FENCED = _FINISH_FENCED_TEMPLATE.replace(":started", _STARTED)


# One attempt row per finished payment; %s: started_at, worker, then the arrays.
INSERT_ATTEMPTS = """
INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
SELECT v.id, v.attempt, %s, now(), %s, v.outcome, v.error
  FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[]) AS v(id, attempt, outcome, error)
ON CONFLICT (payment_id, attempt) DO NOTHING
"""


# The event of each payment leaving EXECUTING (executed, failed, parked, retry_scheduled);
# %s: actor, then the arrays.
INSERT_FINISH_EVENTS = """
INSERT INTO payments_paymentevent (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
SELECT v.id, v.kind, 'EXECUTING', v.status, v.attempt, %s, v.data::jsonb, now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[]) AS v(id, kind, status, attempt, data)
"""


# A stale (payment, attempt) is recorded once, changing nothing else; %s: started_at,
# worker, ids, attempts. Not a pair whose attempt is still the one in flight: that pair
# was not stale but another executor's (an internal payment's on the payouts queue, or a
# payout's on the execute queue), and a row under its attempt now would stand in for the
# outcome that executor records (ON CONFLICT DO NOTHING would drop it).
INSERT_STALE_ATTEMPTS = """
INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
SELECT p.id, m.attempt, %s, now(), %s, 'stale', 'attempt superseded or payment already finished'
  FROM unnest(%s::text[], %s::int[]) AS m(id, attempt)
  JOIN payments_scheduledpayment p ON p.id = m.id
 WHERE NOT (p.status = 'EXECUTING' AND p.attempt = m.attempt)
ON CONFLICT (payment_id, attempt) DO NOTHING
"""


# A worker starts a batch: a start marker for each (payment, attempt) of the message,
# committed before the work so that a worker that dies mid-way has still spent the try;
# the same claim started again (a redelivered or retried message) adds nothing. The try
# is counted in the payment's ``tries`` when the attempt ends: by FINISH_FENCED (and seen
# by LOCK_FENCED before that), or by the claim that takes the row after its lease expired.
# A stale pair's marker is never counted (no attempt of it is current) and the purge
# takes it. One narrow insert into an unlogged table instead of a new version of each
# payment row (docs/decisions/0008-start-markers-off-the-row.md).
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
MARK_STARTED = """
INSERT INTO payments_startmarker (payment_id, attempt)
SELECT m.id, m.attempt FROM unnest(%(ids)s::text[], %(attempts)s::int[]) AS m(id, attempt)
    ON CONFLICT DO NOTHING
"""

# Payouts keep the count on the row (payouts/executor.py): their tries are read and
# written back by their own statements (LOCK_FENCED_PAYOUTS, UPDATE_PAYOUTS). Only
# unindexed columns change; the expected status is a column of the unnest for the
# reason given at LOCK_FENCED.
MARK_STARTED_IN_ROW = """
UPDATE payments_scheduledpayment p
   SET tries = p.tries + 1, tried_attempt = p.attempt
  FROM unnest(%(ids)s::text[], %(attempts)s::int[], %(expected)s::text[]) AS m(id, attempt, status)
 WHERE p.id = ANY(%(ids)s::text[]) AND p.id = m.id AND p.attempt = m.attempt AND p.status = m.status
   AND p.tried_attempt IS DISTINCT FROM p.attempt
"""

# Start markers no attempt needs any more: their payment is not EXECUTING at their
# attempt (it ended, and was counted, or the marker was a stale pair's). A marker is
# written only after its claim committed, so one still needed is always seen as such.
# %s: batch size.
PURGE_START_MARKERS = """
DELETE FROM payments_startmarker m
 WHERE (m.payment_id, m.attempt) IN (
        SELECT s.payment_id, s.attempt FROM payments_startmarker s
         WHERE NOT EXISTS (SELECT 1 FROM payments_scheduledpayment p
                            WHERE p.id = s.payment_id AND p.attempt = s.attempt AND p.status = 'EXECUTING')
         LIMIT %s)
"""


# ======================================================================================
# Schedule and reschedule (services.py)
# ======================================================================================

# Cancel: a CAS from SCHEDULED or NEEDS_REVIEW (the claim races it on the same row; a
# payout's reserve is written under that row's lock, so the NOT EXISTS sees it),
# returning the status it left so the event records it; %s: the payment id.
CANCEL_PENDING = """
WITH old AS (
    SELECT id, status FROM payments_scheduledpayment p
     WHERE id = %s AND status IN ('SCHEDULED', 'NEEDS_REVIEW')
       -- A payout whose funds are reserved may have been paid by its rail: never cancelled.
       AND NOT EXISTS (SELECT 1 FROM payments_payout o WHERE o.payment_id = p.id AND o.state = 'pending')
       FOR NO KEY UPDATE
)
UPDATE payments_scheduledpayment p
   SET status = 'CANCELLED', cancelled_at = now(), updated_at = now(), version = p.version + 1
  FROM old
 WHERE p.id = old.id
RETURNING old.status
"""


# Re-drive: NEEDS_REVIEW -> SCHEDULED with a fresh budget, due again at %(next_attempt_at)s
# (NULL: at once, its execute_at has passed); returns the attempt for the event.
REDRIVE = """
UPDATE payments_scheduledpayment
   SET status = 'SCHEDULED', tries = 0, tried_attempt = NULL, review_reason = '',
       next_attempt_at = %(next_attempt_at)s, updated_at = now(), version = version + 1
 WHERE id = %(id)s AND status = 'NEEDS_REVIEW'
RETURNING attempt, tries
"""


# Resolve as failed: NEEDS_REVIEW -> FAILED(resolved_by_staff); returns the attempt and
# the review reason for the event.
RESOLVE_FAILED = """
WITH old AS (
    SELECT id, review_reason FROM payments_scheduledpayment
     WHERE id = %(id)s AND status = 'NEEDS_REVIEW' FOR NO KEY UPDATE
)
UPDATE payments_scheduledpayment p
   SET status = 'FAILED', failure_reason = 'resolved_by_staff', updated_at = now(), version = p.version + 1
  FROM old
 WHERE p.id = old.id
RETURNING p.attempt, old.review_reason
"""


# One statement: lock the row, capture the old values, and compare-and-set the new ones
# (status still SCHEDULED, version as expected). Zero rows is a result to classify.
UPDATE_SCHEDULED = """
WITH old AS (
    SELECT id, amount, execute_at, requested_execute_at, version
      FROM payments_scheduledpayment WHERE id = %(id)s FOR NO KEY UPDATE
)
UPDATE payments_scheduledpayment p
   SET amount = %(amount)s, execute_at = %(execute_at)s, requested_execute_at = %(requested)s,
       version = p.version + 1, updated_at = now()
  FROM old
 WHERE p.id = old.id AND p.status = 'SCHEDULED' AND p.version = %(version)s
RETURNING old.amount, old.execute_at, p.version
"""


# ======================================================================================
# Payees (payees.py)
# ======================================================================================

# The owner's payee, not deleted, locked FOR SHARE to the end of the caller's transaction:
# taken by whatever creates something that pays it (a payout, a series, an occurrence)
# before anything is inserted. payee_delete locks the row FOR UPDATE and only then counts
# what pays the payee, so the two are serialized on the row: either the delete commits
# first, and this statement, re-reading the row it waited for, finds it deleted (no row:
# "no such payee"), or the creator commits first and the delete's count sees what it
# inserted (payee_in_use). FOR SHARE, not KEY SHARE: it conflicts with every change of the
# row, whatever lock a delete takes. It costs the creator nothing new: the payment's
# foreign key takes a KEY SHARE lock on the same row at commit, already held by then.
# %(id)s: the payee, %(owner)s: the payer; returns its rail.
LOCK_PAYEE = """
SELECT rail FROM payments_payee
 WHERE id = %(id)s AND owner_id = %(owner)s AND deleted_at IS NULL
   FOR SHARE
"""


# ======================================================================================
# Idempotency keys (idempotency.py)
# ======================================================================================

# SET LOCAL lock_timeout with a bound value (SET itself takes no parameters): a request
# with a key in use waits on the first one's row lock for at most that long.
SET_LOCAL_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
# The first request with a key inserts its row; %s: actor id, key, fingerprint.
IDEMPOTENCY_CLAIM_KEY = """
INSERT INTO payments_idempotencykey (actor_id, key, fingerprint, response_body, created_at)
VALUES (%s, %s, %s, '', now())
ON CONFLICT (actor_id, key) DO NOTHING RETURNING id
"""


# Keys older than %s, %s rows per transaction so no lock is held for long.
IDEMPOTENCY_PURGE = """
DELETE FROM payments_idempotencykey WHERE id IN (
    SELECT id FROM payments_idempotencykey WHERE created_at < now() - %s LIMIT %s)
"""


# ======================================================================================
# Degraded mode (fallback.py)
# ======================================================================================

# While Redis is down one promoter of the fleet executes from the database: the one that
# holds this session-level advisory lock (a bigint key). Taken on a connection of its own
# and kept across transactions; PostgreSQL drops it when that session ends, so a promoter
# that dies hands it on. The "try" form never waits: a promoter that does not get it
# just looks again a second later.
FALLBACK_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
FALLBACK_UNLOCK = "SELECT pg_advisory_unlock(%s)"
# Is this session (and so its lock) still alive? Asked before each degraded round.
FALLBACK_SESSION_ALIVE = "SELECT 1"


# ======================================================================================
# Per-user limits (limits.py)
# ======================================================================================

# Serializes one payer's admissions (schedule, reschedule, a series created or changed):
# count, then insert, under one lock, so two requests at the cap cannot both pass. A
# transaction-level advisory lock, released at commit or rollback, keyed by the payer's
# id in a namespace of its own (the two-int4 form; the fallback's bigint key never
# collides with it). Never taken by the promoter or the workers.
LOCK_PAYER_LIMITS = "SELECT pg_advisory_xact_lock(%(namespace)s::int4, %(payer)s::int4)"

# Each payer's pending one-off payments: SCHEDULED (waiting for their time, or for a
# retry) and not an occurrence of a recurring payment (the series limit bounds those).
# No SCHEDULED row is due before the oldest one the sweep's partial indexes know of,
# so the payers' rows are read from there on (the lookup table's payments_lookup_payer_idx,
# then each payment by primary key): their future ones and whatever they have overdue,
# never their whole history. Reading only by payer cost
# 130 ms for a payer with 300,000 finished payments; this, 0.2 ms. The admission check
# asks for one payer, the admin's usage page for a page of them.
PENDING_PAYMENTS_BY_PAYER = """
SELECT k.payer_id, count(*) FROM payments_paymentlookup k
  JOIN payments_scheduledpayment p ON p.id = k.payment_id
 WHERE k.payer_id = ANY(%(payers)s::int4[]) AND p.status = 'SCHEDULED' AND p.recurring_id IS NULL
   AND k.execute_at >= least(
       (SELECT execute_at FROM payments_scheduledpayment
         WHERE status = 'SCHEDULED' AND next_attempt_at IS NULL ORDER BY execute_at LIMIT 1),
       (SELECT min(execute_at) FROM payments_scheduledpayment
         WHERE status = 'SCHEDULED' AND next_attempt_at IS NOT NULL))
 GROUP BY k.payer_id
"""

# What each payer's payments take out per UTC day in [since, until): every payment not
# cancelled and not failed (executed ones count: that money left on that day), except
# that an occurrence of an ACTIVE or PAUSED series, on the day it was generated for,
# counts only by what it exceeds the series' amount by: the series' own reservation
# (limits.series_reserved) already covers it. ``series``/``series_amount`` give one
# series' amount as it is about to become (a series being changed); ``exclude`` leaves
# one payment out (a payment being changed). Served by payments_lookup_payer_idx (then
# each payment by primary key).
OUTFLOW_BY_PAYER_AND_DAY = """
SELECT k.payer_id, (k.execute_at AT TIME ZONE 'UTC')::date AS day,
       sum(CASE
             WHEN r.status IN ('ACTIVE', 'PAUSED')
              AND (p.occurrence_at AT TIME ZONE 'UTC')::date = (p.execute_at AT TIME ZONE 'UTC')::date
             THEN greatest(p.amount - CASE WHEN r.id = %(series)s::text THEN %(series_amount)s::bigint
                                           ELSE r.amount END, 0)
             ELSE p.amount
           END) AS total
  FROM payments_paymentlookup k
  JOIN payments_scheduledpayment p ON p.id = k.payment_id
  LEFT JOIN payments_recurringpayment r ON r.id = p.recurring_id
 WHERE k.payer_id = ANY(%(payers)s::int4[])
   AND k.execute_at >= %(since)s AND k.execute_at < %(until)s
   AND p.status NOT IN ('CANCELLED', 'FAILED')
   AND p.id <> %(exclude)s
 GROUP BY 1, 2
"""

# The admin's usage page: payers worth a close look, the top %(n)s by pending one-off
# payments, by their busiest day from %(today)s on, by reserving series and by those
# series' summed amounts; limits.payer_usages then measures them exactly. One pass over
# the SCHEDULED rows (the OR lets the planner read them from the sweep's two partial
# indexes once history dwarfs the schedule) and one over the series: 0.5-0.8 s with
# 500,000 scheduled among 1.8 million payments, on a page staff open, never on a request
# path.
LIMIT_CANDIDATES = """
WITH days AS (
    SELECT payer_id, (execute_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n, sum(amount) AS total
      FROM payments_scheduledpayment
     WHERE ((status = 'SCHEDULED' AND next_attempt_at IS NULL)
         OR (status = 'SCHEDULED' AND next_attempt_at IS NOT NULL))
       AND recurring_id IS NULL
     GROUP BY 1, 2
), payers AS MATERIALIZED (
    SELECT payer_id, sum(n) AS pending, max(total) FILTER (WHERE day >= %(today)s) AS busiest FROM days GROUP BY 1
), series AS MATERIALIZED (
    SELECT payer_id, count(*) AS n, sum(amount) AS amount FROM payments_recurringpayment
     WHERE status IN ('ACTIVE', 'PAUSED') GROUP BY 1
)
(SELECT payer_id FROM payers ORDER BY pending DESC LIMIT %(n)s)
UNION (SELECT payer_id FROM payers WHERE busiest IS NOT NULL ORDER BY busiest DESC LIMIT %(n)s)
UNION (SELECT payer_id FROM series ORDER BY n DESC LIMIT %(n)s)
UNION (SELECT payer_id FROM series ORDER BY amount DESC LIMIT %(n)s)
"""
