"""Fill an empty database with a large, consistent synthetic history, to measure
``manage.py reconcile`` at scale (e.g. a million payments)."""

import time

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from payments.models import ScheduledPayment

# Set-based generation: every table in one INSERT ... SELECT over generate_series.
# Payment g: status by g % 20 (0 cancelled, 1 failed, 2 scheduled, 3 executing, else
# executed; every 50th executed one was re-claimed once, its first attempt stale).
PAYMENTS_SQL = """
INSERT INTO payments_scheduledpayment
       (id, payer_id, from_account_id, to_account_id, amount, execute_at, status, failure_reason,
        attempt, lease_until, claimed_at, executed_at, cancelled_at, version, created_at, updated_at)
SELECT 'pay_SYN' || lpad(g::text, 23, '0'), %(owner)s,
       'acc_SYN' || lpad((g %% %(accounts)s)::text, 10, '0'),
       'acc_SYN' || lpad(((g %% %(accounts)s + 1 + g %% 7) %% %(accounts)s)::text, 10, '0'),
       1 + g %% 100,
       CASE WHEN g %% 20 = 2 THEN now() + interval '1 day' ELSE now() - interval '1 hour' END,
       s.status,
       CASE WHEN s.status = 'FAILED' THEN 'insufficient_funds' ELSE '' END,
       s.attempt,
       CASE WHEN s.status = 'EXECUTING' THEN now() + interval '1 hour' END,
       CASE WHEN s.attempt > 0 THEN now() - interval '59 minutes' END,
       CASE WHEN s.status = 'EXECUTED' THEN now() - interval '58 minutes' END,
       CASE WHEN s.status = 'CANCELLED' THEN now() - interval '2 hours' END,
       1, now() - interval '3 hours', now()
  FROM generate_series(1, %(payments)s) AS g,
       LATERAL (SELECT CASE g %% 20 WHEN 0 THEN 'CANCELLED' WHEN 1 THEN 'FAILED' WHEN 2 THEN 'SCHEDULED'
                                    WHEN 3 THEN 'EXECUTING' ELSE 'EXECUTED' END AS status) s0,
       LATERAL (SELECT s0.status,
                       CASE WHEN s0.status IN ('CANCELLED', 'SCHEDULED') THEN 0
                            WHEN s0.status = 'EXECUTED' AND g %% 50 = 5 THEN 2 ELSE 1 END AS attempt) s
"""

EVENTS_SQL = """
INSERT INTO payments_paymentevent (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
SELECT p.id, e.kind, e.from_status, e.to_status, e.attempt, 'synthetic', '{}'::jsonb, now()
  FROM payments_scheduledpayment p,
       LATERAL (VALUES ('created', '', 'SCHEDULED', 0, true),
                       ('cancelled', 'SCHEDULED', 'CANCELLED', 0, p.status = 'CANCELLED'),
                       ('reclaimed', 'EXECUTING', 'EXECUTING', 2, p.attempt >= 2),
                       ('executed', 'EXECUTING', 'EXECUTED', p.attempt, p.status = 'EXECUTED'),
                       ('failed', 'EXECUTING', 'FAILED', p.attempt, p.status = 'FAILED')
               ) AS e(kind, from_status, to_status, attempt, wanted)
 WHERE e.wanted AND p.id LIKE 'pay\\_SYN%%'
"""

ATTEMPTS_SQL = """
INSERT INTO payments_executionattempt (payment_id, attempt, started_at, finished_at, worker, outcome, error)
SELECT p.id, a.attempt, now(), now(), 'synthetic', a.outcome, ''
  FROM payments_scheduledpayment p,
       LATERAL (VALUES (1, 'stale', p.attempt = 2),
                       (p.attempt, 'executed', p.status = 'EXECUTED'),
                       (p.attempt, 'failed', p.status = 'FAILED')) AS a(attempt, outcome, wanted)
 WHERE a.wanted AND p.id LIKE 'pay\\_SYN%%'
"""


class Command(BaseCommand):
    help = "Generate N payments of consistent synthetic history (for measuring reconcile). Empty databases only."

    def add_arguments(self, parser):
        parser.add_argument("--payments", type=int, default=1_000_000)
        parser.add_argument("--accounts", type=int, default=10_000)

    def handle(self, *args, payments, accounts, **options):
        if ScheduledPayment.objects.exists():
            raise CommandError("the database already has payments; synthesize_history only fills an empty one")
        owner, _ = get_user_model().objects.get_or_create(
            username="synthetic", defaults={"password": make_password(None)}
        )
        params = {"payments": payments, "accounts": accounts, "owner": owner.pk}
        started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                "INSERT INTO ledger_account (id, owner_id, name, kind, status, balance, created_at, updated_at)"
                " SELECT 'acc_SYN' || lpad(g::text, 10, '0'), %(owner)s, 'synthetic ' || g, 'user', 'active', 0,"
                " now(), now() FROM generate_series(0, %(accounts)s - 1) AS g",
                params,
            )
            cur.execute(
                "INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)"
                " SELECT 'dep_SYN' || id, 'acc_issuance', id, 1000000000, now() FROM ledger_account"
                " WHERE id LIKE 'acc\\_SYN%%'"
            )
            cur.execute(PAYMENTS_SQL, params)
            cur.execute(EVENTS_SQL)
            cur.execute(ATTEMPTS_SQL)
            cur.execute(
                "INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)"
                " SELECT id, from_account_id, to_account_id, amount, executed_at FROM payments_scheduledpayment"
                " WHERE status = 'EXECUTED'"
            )
            cur.execute(
                "WITH e AS (SELECT account_id, sum(delta) AS net FROM ("
                "  SELECT credit_account_id AS account_id, amount AS delta FROM ledger_transfer"
                "  UNION ALL SELECT debit_account_id, -amount FROM ledger_transfer) x GROUP BY account_id)"
                " UPDATE ledger_account a SET balance = e.net FROM e WHERE a.id = e.account_id"
            )
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
        seconds = time.monotonic() - started
        self.stdout.write(f"synthesized {payments} payments over {accounts} accounts in {seconds:.1f}s")
