"""Every raw SQL statement of the webhooks app, named.

The outbox triggers that fill webhooks_event live in migration 0002 (they are schema).
The statements here are the dispatcher's: fan-out, the watch between ticks, claim,
record; and the readings of the metrics. Each claim is one statement with ``SKIP
LOCKED`` (as the promoter's), so concurrent dispatchers take disjoint rows and never wait
on each other.
"""

# ======================================================================================
# Fan-out (dispatcher.fan_out)
# ======================================================================================

# Events not fanned out yet, oldest first (webhooks_event_todo_idx), locked against
# concurrent dispatchers; one delivery per enabled endpoint of the event's owner that is
# subscribed to its type; then the events are marked. One statement, one commit. ON
# CONFLICT: a fan-out that committed its deliveries but whose statement is re-run (never,
# as one statement is atomic; kept as a belt for a manual replay) adds nothing twice.
FAN_OUT = """
WITH todo AS (
    SELECT id, type, owner_id FROM webhooks_event
     WHERE fanned_out_at IS NULL
     ORDER BY id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), inserted AS (
    INSERT INTO webhooks_delivery
           (event_id, endpoint_id, status, attempts, next_attempt_at, last_error, created_at, updated_at)
    SELECT t.id, e.id, 'pending', 0, now(), '', now(), now()
      FROM todo t
      JOIN webhooks_endpoint e ON e.owner_id = t.owner_id AND e.enabled AND t.type = ANY(e.events)
     ORDER BY t.id, e.id
        ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING 1
), marked AS (
    UPDATE webhooks_event w SET fanned_out_at = now() FROM todo WHERE w.id = todo.id RETURNING 1
)
SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM inserted)
"""


# Whether a dispatch would find work: an event not fanned out, or a pending delivery that
# is due. Two index probes (webhooks_event_todo_idx, webhooks_delivery_due_idx), no lock,
# no write: what a dispatch watching between two beat ticks asks every
# DELAYPAY_WEBHOOK_POLL_SECONDS (docs/decisions/0018-prompt-webhooks.md). Rows another
# dispatcher holds answer yes too; the dispatch that follows skips them and finds nothing,
# which costs one round, not a wrong delivery.
WORK_WAITING = """
SELECT EXISTS (SELECT 1 FROM webhooks_event WHERE fanned_out_at IS NULL)
    OR EXISTS (SELECT 1 FROM webhooks_delivery WHERE status = 'pending' AND next_attempt_at <= now())
"""


# ======================================================================================
# Deliver (dispatcher.claim_deliveries, dispatcher.record)
# ======================================================================================

# Due pending deliveries (webhooks_delivery_due_idx), locked against concurrent
# dispatchers, leased: next_attempt_at moves to the lease's end, so a delivery whose
# dispatcher died falls due again by itself when the lease expires (at least once), and
# a live one is not due. lease_until (the same instant) is the fencing token the record
# must present. Returns what the HTTP request needs, endpoint and event joined.
CLAIM_DELIVERIES = """
WITH due AS (
    SELECT id FROM webhooks_delivery
     WHERE status = 'pending' AND next_attempt_at <= now()
     ORDER BY next_attempt_at, id
     LIMIT %(batch)s
       FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhooks_delivery d
       SET lease_until = now() + make_interval(secs => %(lease)s),
           next_attempt_at = now() + make_interval(secs => %(lease)s),
           updated_at = now()
      FROM due
     WHERE d.id = due.id
 RETURNING d.id, d.attempts, d.lease_until, d.event_id, d.endpoint_id
)
SELECT c.id, c.attempts, c.lease_until,
       ev.id, ev.type, ev.created_at,
       -- A terminal payment event has no snapshot: its payment row is frozen, read it now
       -- (NULL if the payment's month was archived since).
       coalesce(ev.snapshot, (SELECT to_jsonb(p) FROM payments_scheduledpayment p WHERE p.id = ev.payment_id)),
       ev.payment_id, ev.recurring_id,
       en.id, en.url, en.enabled, en.secret, en.previous_secret,
       en.previous_secret_expires_at IS NOT NULL AND en.previous_secret_expires_at > now()
  FROM claimed c
  JOIN webhooks_event ev ON ev.id = c.event_id
  JOIN webhooks_endpoint en ON en.id = c.endpoint_id
 ORDER BY c.id
"""

# One attempt row per HTTP try that was made (or refused by the address check).
INSERT_ATTEMPTS = """
INSERT INTO webhooks_deliveryattempt (delivery_id, attempt, started_at, latency_ms, status_code, response_body, error)
SELECT v.id, v.attempt, v.started_at, v.latency_ms, v.status_code, v.body, v.error
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started_ats)s::timestamptz[], %(latencies)s::int[],
              %(status_codes)s::int[], %(bodies)s::text[], %(errors)s::text[])
       AS v(id, attempt, started_at, latency_ms, status_code, body, error)
"""

# The outcome of each try, fenced by the lease it was claimed with: a dispatcher whose
# lease expired (and whose delivery another took) changes nothing. %(delays)s: seconds
# until the next try (NULL when succeeded or failed).
RECORD_OUTCOMES = """
UPDATE webhooks_delivery d
   SET status = v.status,
       attempts = v.attempt,
       next_attempt_at = CASE WHEN v.delay IS NULL THEN d.next_attempt_at
                              ELSE now() + make_interval(secs => v.delay) END,
       lease_until = NULL,
       last_status_code = v.status_code,
       last_error = v.error,
       updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(leases)s::timestamptz[], %(statuses)s::text[], %(attempts)s::int[],
              %(delays)s::float8[], %(status_codes)s::int[], %(errors)s::text[])
       AS v(id, lease_until, status, attempt, delay, status_code, error)
 WHERE d.id = v.id AND d.status = 'pending' AND d.lease_until = v.lease_until
RETURNING d.id
"""

# Deliveries of a disabled endpoint end without a try (resend brings them back).
FAIL_FOR_DISABLED = """
UPDATE webhooks_delivery d
   SET status = 'failed', lease_until = NULL, last_error = 'endpoint disabled', updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(leases)s::timestamptz[]) AS v(id, lease_until)
 WHERE d.id = v.id AND d.status = 'pending' AND d.lease_until = v.lease_until
"""

# A success ends an endpoint's run of failures.
ENDPOINTS_SUCCEEDED = """
UPDATE webhooks_endpoint SET failing_since = NULL, updated_at = now()
 WHERE id = ANY(%(ids)s::text[]) AND failing_since IS NOT NULL
"""

# A failure starts one (if none is running); an endpoint failing without a success for
# longer than %(disable_after)s seconds is disabled, with the reason its owner sees.
# Returns the endpoints this disabled. Locks in id order (see dispatcher.record).
ENDPOINTS_FAILED = """
WITH old AS (
    SELECT id, enabled, failing_since,
           enabled AND failing_since < now() - make_interval(secs => %(disable_after)s) AS disable
      FROM webhooks_endpoint
     WHERE id = ANY(%(ids)s::text[])
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE webhooks_endpoint e
   SET failing_since = coalesce(old.failing_since, now()),
       enabled = old.enabled AND NOT coalesce(old.disable, false),
       disabled_reason = CASE WHEN old.disable
                              THEN 'failing since ' || to_char(old.failing_since AT TIME ZONE 'UTC',
                                                               'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                                   || ' without a successful delivery'
                              ELSE e.disabled_reason END,
       version = e.version + CASE WHEN old.disable THEN 1 ELSE 0 END,
       updated_at = now()
  FROM old
 WHERE e.id = old.id
RETURNING e.id, coalesce(old.disable, false)
"""

# Leases given back unused (the dispatcher ran out of lease time before trying them):
# due again at once.
RELEASE = """
UPDATE webhooks_delivery d
   SET lease_until = NULL, next_attempt_at = now(), updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(leases)s::timestamptz[]) AS v(id, lease_until)
 WHERE d.id = v.id AND d.status = 'pending' AND d.lease_until = v.lease_until
"""


# ======================================================================================
# Resend (services.delivery_resend)
# ======================================================================================

# Back to pending, due now, a fresh run of the ladder; a pending one is only made due
# now. Returns the delivery's endpoint for the caller's checks.
RESEND = """
UPDATE webhooks_delivery
   SET status = 'pending', attempts = CASE WHEN status = 'pending' THEN attempts ELSE 0 END,
       next_attempt_at = now(), lease_until = NULL, updated_at = now()
 WHERE id = %(id)s
RETURNING id
"""


# ======================================================================================
# Readings (selectors.webhook_health: metrics)
# ======================================================================================

# The backlog and how late the oldest due work is: an event not fanned out yet (its
# age), or a pending delivery whose next try is due (how long past due). Both read only
# their partial indexes. A delivery waiting on its ladder is not late: it waits by design.
HEALTH = """
SELECT (SELECT count(*) FROM webhooks_event WHERE fanned_out_at IS NULL),
       (SELECT count(*) FROM webhooks_delivery WHERE status = 'pending'),
       greatest(
           0,
           coalesce(extract(epoch FROM now() - (SELECT created_at FROM webhooks_event
                                                  WHERE fanned_out_at IS NULL ORDER BY id LIMIT 1)), 0),
           coalesce(extract(epoch FROM now() - (SELECT min(next_attempt_at) FROM webhooks_delivery
                                                  WHERE status = 'pending')), 0)
       )::float8
"""
