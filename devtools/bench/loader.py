"""Set-based scenario loading: a few INSERT ... SELECT generate_series statements.

Loading is not part of any measurement, but it must be fast enough for 2,000,000
payments, so nothing here goes row by row through Python or the ORM. The rows look
like the ones the API writes: a ``created`` event per payment, and every user account
funded through a deposit transfer from the issuance account (so each balance equals
its transfers and the sum of balances stays zero).

Outcomes are planted, not left to chance: every payer is funded with exactly what its
normal payments need, and every ``UNDERFUNDED_EVERY``-th payment asks for more than
the whole system holds, so exactly those payments end FAILED(insufficient_funds)
whatever order the batches run in.
"""

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from ledger.models import ISSUANCE_ACCOUNT_ID
from payments.partitions import id_bound, month_of

UNDERFUNDED_EVERY = 50  # 2%
UNDERFUNDED_AMOUNT = 10**12  # more than the sum of every balance in any scenario
MAX_AMOUNT = 100  # normal payments are 1..MAX_AMOUNT units
BENCH_USERNAME = "bench"

# How execute_at is spread (fixed SQL fragments; never built from input).
TIMINGS = {
    # All at the same instant: the burst.
    "at": "%(due_at)s::timestamptz",
    # Evenly spaced over the window: the steady load (rate = payments / window).
    "even": "%(due_at)s::timestamptz + ((g - %(first)s) * %(step)s) * interval '1 second'",
    # Uniformly at random over the window: a schedule that is mostly in the future, or
    # a burst whose payers opted into jitter (see ``jitter_seconds``).
    "random": "%(due_at)s::timestamptz + (random() * %(window)s) * interval '1 second'",
}


def account_id(n: int) -> str:
    return f"acc_bench_{n:08d}"


# Bench payments' ids sort like ids made at the start of this month (the ULID's time,
# then n), so they land in this month's partition as real ones would
# (payments/partitions.py), not in the default partition.
BENCH_ID_PREFIX = id_bound(month_of(datetime.now(UTC)))[:14]


def payment_id(n: int) -> str:
    return f"{BENCH_ID_PREFIX}{n:016d}"


TREASURY_ACCOUNT = account_id(1)

ACCOUNTS_SQL = """
INSERT INTO ledger_account (id, owner_id, name, kind, status, balance, created_at, updated_at)
SELECT 'acc_bench_' || lpad(g::text, 8, '0'), %(owner)s,
       CASE WHEN g = 1 THEN 'bench treasury' ELSE 'bench ' || g END,
       'user', 'active', 0, now(), now()
  FROM generate_series(1, %(accounts)s) AS g
"""

# The tail of a loading statement: deposit into each payer what its rows (CTE ``need``:
# account_id, total) need, from the issuance account, as the API's deposits would.
FUND_PAYERS_SQL = """), deposits AS (
    INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)
    SELECT 'dep_bench_' || %(first)s || '_' || account_id, %(issuance)s, account_id, total, now() FROM need
), credited AS (
    UPDATE ledger_account a SET balance = a.balance + need.total, updated_at = now()
      FROM need WHERE a.id = need.account_id
)
UPDATE ledger_account
   SET balance = balance - (SELECT coalesce(sum(total), 0) FROM need), updated_at = now()
 WHERE id = %(issuance)s
"""

_PAYMENTS_SQL_HEAD = """
WITH src AS (
    SELECT g, f,
           CASE WHEN %(hot)s THEN 2 + floor(random() * (%(accounts)s - 1))::int
                ELSE (f + floor(random() * (%(accounts)s - 1))::int) %% %(accounts)s + 1 END AS t,
           CASE WHEN g %% %(every)s = 0 THEN %(too_much)s::bigint
                ELSE 1 + floor(random() * %(max_amount)s)::bigint END AS amount,
           {execute_at} AS execute_at,
           CASE WHEN %(jitter)s > 0 THEN %(due_at)s::timestamptz END AS requested_execute_at
      FROM (SELECT g, CASE WHEN %(hot)s THEN 1 ELSE 1 + floor(random() * %(accounts)s)::int END AS f
              FROM generate_series(%(first)s, %(last)s) AS g) AS s
), ins AS (
    INSERT INTO payments_scheduledpayment
           (id, payer_id, from_account_id, to_account_id, amount, execute_at, requested_execute_at,
            jitter_seconds, status, failure_reason, attempt, version, created_at, updated_at)
    SELECT %(id_prefix)s || lpad(g::text, 16, '0'), %(payer)s,
           'acc_bench_' || lpad(f::text, 8, '0'), 'acc_bench_' || lpad(t::text, 8, '0'),
           amount, execute_at, coalesce(requested_execute_at, execute_at), %(jitter)s,
           'SCHEDULED', '', 0, 1, now(), now()
      FROM src
 RETURNING id, from_account_id, amount, execute_at
), created AS (
    INSERT INTO payments_paymentevent
           (payment_id, kind, from_status, to_status, attempt, actor, actor_user_id, data, created_at)
    SELECT id, 'created', '', 'SCHEDULED', 0, %(actor)s, %(payer)s,
           jsonb_build_object('amount', amount, 'execute_at', execute_at), now()
      FROM ins
), need AS (
    SELECT from_account_id AS account_id, sum(amount) AS total
      FROM ins WHERE amount < %(too_much)s GROUP BY from_account_id
"""
PAYMENTS_SQL = _PAYMENTS_SQL_HEAD + FUND_PAYERS_SQL  # fixed fragments, never input


@dataclass(frozen=True)
class Loaded:
    first: int
    last: int
    payments: int
    underfunded: int  # these, and only these, must end FAILED(insufficient_funds)


def bench_user():
    user, created = get_user_model().objects.get_or_create(username=BENCH_USERNAME)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def load_accounts(*, accounts: int) -> None:
    """``accounts`` empty user accounts ``acc_bench_00000001``...; number 1 is the treasury."""
    if accounts < 2:
        raise ValueError("a scenario needs at least 2 accounts")
    with connection.cursor() as cur:
        cur.execute(ACCOUNTS_SQL, {"owner": bench_user().pk, "accounts": accounts})


def underfunded_count(first: int, last: int) -> int:
    return last // UNDERFUNDED_EVERY - (first - 1) // UNDERFUNDED_EVERY


def load_payments(
    *,
    payments: int,
    accounts: int,
    due_at: datetime,
    timing: str = "at",
    window_seconds: float = 0.0,
    hot_sender: bool = False,
    jitter_seconds: int = 0,
    first: int = 1,
    seed: float = 0.42,
) -> Loaded:
    """Insert ``payments`` SCHEDULED payments numbered from ``first``, their ``created``
    events, and the deposits that fund their payers; one transaction.

    ``timing``: "at" (all due at ``due_at``), "even" (spread evenly over
    ``window_seconds`` from ``due_at``) or "random" (uniformly over the window).
    ``hot_sender``: every payment debits the treasury account (number 1).
    ``jitter_seconds``: the payers opted into jitter, as POST /payments does: every
    payment asked for ``due_at`` (``requested_execute_at``) and is due uniformly in
    [due_at, due_at + jitter]; implies the "random" timing over that window.
    """
    if jitter_seconds:
        timing, window_seconds = "random", float(jitter_seconds)
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {sorted(TIMINGS)}")
    if payments < 1:
        raise ValueError("payments must be positive")
    last = first + payments - 1
    payer = bench_user()
    params = {
        "hot": hot_sender,
        "accounts": accounts,
        "every": UNDERFUNDED_EVERY,
        "too_much": UNDERFUNDED_AMOUNT,
        "max_amount": MAX_AMOUNT,
        "first": first,
        "last": last,
        "due_at": due_at,
        "step": window_seconds / payments,
        "window": window_seconds,
        "jitter": int(jitter_seconds),
        "payer": payer.pk,
        "actor": f"user:{payer.pk}",
        "issuance": ISSUANCE_ACCOUNT_ID,
        "id_prefix": BENCH_ID_PREFIX,
    }
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT setseed(%s)", [seed])
        cur.execute(PAYMENTS_SQL.format(execute_at=TIMINGS[timing]), params)
    return Loaded(first=first, last=last, payments=payments, underfunded=underfunded_count(first, last))


def load_stream_and_burst(
    *, payments: int, burst: int, accounts: int, due_at: datetime, window_seconds: float, burst_at: datetime
) -> Loaded:
    """A steady stream (``payments`` due evenly over ``window_seconds`` from ``due_at``) and
    a burst of ``burst`` more, numbered after it, all due at ``burst_at``."""
    stream = load_payments(payments=payments, accounts=accounts, due_at=due_at, timing="even",
                           window_seconds=window_seconds)
    spike = load_payments(payments=burst, accounts=accounts, due_at=burst_at, first=stream.last + 1, seed=0.43)
    return Loaded(first=stream.first, last=spike.last, payments=stream.payments + spike.payments,
                  underfunded=stream.underfunded + spike.underfunded)


# Finished history (bench burst --history): EXECUTED payments made over the past months,
# each with what the engine leaves in the schedule: two events (created and executed:
# a first claim writes none), one attempt and its transfer. Payments come in pairs
# that pay the same amount back, so no balance changes. ``prefixes`` holds each past
# month's id prefix (payments/partitions.py): row g lands in month g % months.
HISTORY_SQL = """
WITH src AS (
    SELECT g, 1 + (g / 2) %% %(accounts)s AS a, 1 + ((g / 2) * 7919 + 1) %% %(accounts)s AS b,
           1 + (g / 2) %% 1000 AS amount, g %% %(months)s AS m
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
), rows AS (
    SELECT g, amount,
           (%(prefixes)s::text[])[1 + m] || lpad(g::text, 16, '0') AS id,
           'acc_bench_' || lpad((CASE WHEN g %% 2 = 0 THEN a ELSE b END)::text, 8, '0') AS f,
           'acc_bench_' || lpad((CASE WHEN g %% 2 = 0 THEN b ELSE a END)::text, 8, '0') AS t,
           (%(starts)s::timestamptz[])[1 + m] + (g %% 2000000) * interval '1 second' AS made
      FROM src WHERE a <> b
), ins AS (
    INSERT INTO payments_scheduledpayment
           (id, payer_id, from_account_id, to_account_id, amount, execute_at, requested_execute_at,
            jitter_seconds, status, failure_reason, attempt, tries, tried_attempt, version, claimed_at,
            executed_at, created_at, updated_at)
    SELECT id, %(payer)s, f, t, amount, made + interval '1 hour', made + interval '1 hour', 0, 'EXECUTED', '',
           1, 1, 1, 3, made + interval '1 hour', made + interval '1 hour 1 second', made,
           made + interval '1 hour 1 second'
      FROM rows
 RETURNING id, from_account_id, to_account_id, amount, execute_at, executed_at, created_at
), events AS (
    INSERT INTO payments_paymentevent
           (payment_id, kind, from_status, to_status, attempt, actor, actor_user_id, data, created_at)
    SELECT id, k.kind, k.from_status, k.to_status, k.attempt, %(actor)s, NULL, '{}'::jsonb, executed_at
      FROM ins CROSS JOIN (VALUES ('created', '', 'SCHEDULED', 0),
                                  ('executed', 'EXECUTING', 'EXECUTED', 1)) AS k(kind, from_status, to_status, attempt)
), attempts AS (
    INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
    SELECT id, 1, execute_at, executed_at, 'bench', 'executed', '' FROM ins
)
INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)
SELECT id, from_account_id, to_account_id, amount, executed_at FROM ins
"""
HISTORY_CHUNK = 500_000


def load_history(*, payments: int, accounts: int, months: int = 12, say=None) -> dict:
    """``payments`` EXECUTED payments spread over the ``months`` before this one, in their
    months' partitions (made here), loaded in transactions of HISTORY_CHUNK."""
    from payments.partitions import Month, add_months, create_month

    this_month = month_of(datetime.now(UTC))
    past = [Month(add_months(this_month, -k)) for k in range(months, 0, -1)]
    with transaction.atomic(), connection.cursor() as cur:
        for month in past:
            create_month(cur, month)
    payer = bench_user()
    params = {"accounts": accounts, "months": months, "payer": payer.pk, "actor": f"user:{payer.pk}",
              "prefixes": [m.low[:14] for m in past], "starts": [m.start for m in past]}
    started, done = time.monotonic(), 0
    while done < payments:
        size = min(HISTORY_CHUNK, payments - done)
        size += size % 2  # whole pairs: every balance nets to zero
        with transaction.atomic(), connection.cursor() as cur:
            # A scratch database: no WAL flush per chunk, and no webhook outbox for history
            # (it is not the schedule's; reconciliation excuses archived months' events, and
            # the bench's own check reads no webhooks).
            cur.execute("SET LOCAL synchronous_commit = off")
            cur.execute("ALTER TABLE payments_paymentevent DISABLE TRIGGER webhooks_payment_outbox")
            cur.execute(HISTORY_SQL, {**params, "first": done, "last": done + size - 1})
            cur.execute("ALTER TABLE payments_paymentevent ENABLE TRIGGER webhooks_payment_outbox")
        done += size
        if say:
            say(f"  history: {done:,} of {payments:,} payments loaded ({time.monotonic() - started:.0f}s)")
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments_scheduledpayment WHERE status = 'EXECUTED'")
        rows = cur.fetchone()[0]
    return {"payments": rows, "months": months, "load_s": round(time.monotonic() - started, 1)}


def analyze() -> None:
    """Fresh planner statistics after a bulk load, as autovacuum would soon provide.

    VACUUM cannot run inside a transaction: call this outside ``transaction.atomic``.
    """
    with connection.cursor() as cur:
        for table in ("payments_scheduledpayment", "payments_paymentevent", "payments_executionattempt",
                      "ledger_account", "ledger_transfer"):
            cur.execute(f"VACUUM ANALYZE {table}")


def underfunded_ids(first: int, last: int) -> set[str]:
    """The ids planted as underfunded among payments ``first``..``last``."""
    start = -(-first // UNDERFUNDED_EVERY) * UNDERFUNDED_EVERY
    return {payment_id(n) for n in range(start, last + 1, UNDERFUNDED_EVERY)}
