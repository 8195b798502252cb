"""Time the operations console's pages against the configured database (docs/reference/admin-console.md,
"A million rows": the figures for a million payments come from this command).

    DJANGO_DEBUG=1 python manage.py admin_page_timings --seed 1000000   # once, development only
    DJANGO_DEBUG=1 python manage.py admin_page_timings

Requests go through Django's full stack in-process (the test client, as a superuser);
each page is fetched ``--repeat`` times after one warm-up and the median is printed
with the number of SQL queries.
"""

import statistics
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import Account
from ledger.services import account_create

# {payer}, {source}, {target}: the seeded load's payer and accounts; {day}: a day of it.
PAGES = [
    "/admin/payments/scheduledpayment/",
    "/admin/payments/scheduledpayment/?status__exact=SCHEDULED",
    "/admin/payments/scheduledpayment/?due=overdue",
    "/admin/payments/scheduledpayment/?due=today",
    "/admin/payments/scheduledpayment/?due=next_hour",
    "/admin/payments/scheduledpayment/?failure_reason=insufficient_funds",
    "/admin/payments/scheduledpayment/?status__exact=FAILED&due=today",
    "/admin/payments/scheduledpayment/?q=bench-payer",
    "/admin/payments/scheduledpayment/?q=bench-pay",
    "/admin/payments/scheduledpayment/?q=pay_bench0000500000",
    "/admin/payments/scheduledpayment/?payer={payer}",
    "/admin/payments/scheduledpayment/?account={source}&direction=out",
    "/admin/payments/scheduledpayment/?account={target}&direction=in",
    "/admin/payments/scheduledpayment/?account={source}",
    "/admin/payments/scheduledpayment/?account={source}&direction=out&amount_min=100&amount_max=200",
    "/admin/payments/scheduledpayment/?recurrence=one_off",
    "/admin/payments/scheduledpayment/?recurrence=recurring",
    "/admin/payments/scheduledpayment/?due_from={day}&due_to={day}",
    "/admin/payments/scheduledpayment/?p=1000",
    "/admin/payments/scheduledpayment/pay_bench0000500000/change/",
    "/admin/dashboard/",
    "/admin/ledger/account/",
    "/admin/ledger/account/{source}/change/",
    "/admin/ledger/transfer/",
    "/admin/payments/recurringpayment/",
]
# The CSV export: time to its first chunk (the header and the first rows), as a browser
# sees the download start; the rest streams.
EXPORTS = [
    "/admin/payments/scheduledpayment/export/?status__exact=FAILED",
    "/admin/payments/scheduledpayment/export/?account={source}&direction=out",
]

# Payments every 31 s from 180 days ago on: the past ones finished (5% FAILED, 5%
# CANCELLED, the rest EXECUTED), the future ones SCHEDULED. Inserted directly: this is
# a load for timing pages, not money (no transfers are written for it).
SEED_SQL = """
INSERT INTO payments_scheduledpayment (id, payer_id, from_account_id, to_account_id, amount, execute_at, status,
    failure_reason, attempt, claimed_at, executed_at, cancelled_at, version, created_at, updated_at)
SELECT 'pay_bench' || lpad(g::text, 10, '0'), %(payer)s, %(source)s, %(target)s, 1 + g %% 1000, t,
       CASE WHEN t > now() THEN 'SCHEDULED' WHEN g %% 20 = 0 THEN 'FAILED'
            WHEN g %% 20 = 1 THEN 'CANCELLED' ELSE 'EXECUTED' END,
       CASE WHEN t <= now() AND g %% 20 = 0 THEN 'insufficient_funds' ELSE '' END,
       CASE WHEN t > now() OR g %% 20 = 1 THEN 0 ELSE 1 END,
       CASE WHEN t > now() OR g %% 20 = 1 THEN NULL ELSE t END,
       CASE WHEN t <= now() AND g %% 20 NOT IN (0, 1) THEN t + interval '1 second' END,
       CASE WHEN t <= now() AND g %% 20 = 1 THEN t - interval '1 hour' END,
       1, t - interval '1 day', t
  FROM generate_series(1, %(count)s) AS g,
       LATERAL (SELECT now() - interval '180 days' + g * interval '31 seconds' AS t) AS x
    ON CONFLICT (id) DO NOTHING
"""


class Command(BaseCommand):
    help = "Print how long the admin console's pages take on this database (optionally seeding a load first)."

    def add_arguments(self, parser):
        parser.add_argument("--seed", type=int, default=0, help="first insert this many synthetic payments")
        parser.add_argument("--repeat", type=int, default=5)

    def handle(self, *args, seed: int, repeat: int, **options):
        if seed:
            self.seed(seed)
        admin = get_user_model().objects.filter(is_superuser=True, is_active=True).order_by("id").first()
        if admin is None:
            raise CommandError("no active superuser to browse as (make run creates `admin`)")
        client = Client(HTTP_HOST=settings.ALLOWED_HOSTS[0] if settings.ALLOWED_HOSTS else "localhost")
        client.force_login(admin)
        names = self.placeholders()
        self.stdout.write(f"{'median ms':>9} {'queries':>7}  page")
        for template in PAGES:
            self.time_page(client, template.format(**names), repeat, first_byte=False)
        for template in EXPORTS:
            self.time_page(client, template.format(**names), repeat, first_byte=True)

    def time_page(self, client, url: str, repeat: int, *, first_byte: bool) -> None:
        """The median of ``repeat`` requests after a warm-up; for a streamed response
        (``first_byte``) until its first chunk."""

        def fetch():
            response = client.get(url, secure=True)
            if response.streaming:
                next(iter(response.streaming_content), b"")
                response.close()
            return response

        fetch()  # warm-up
        times, queries = [], 0
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as ctx:
                start = time.perf_counter()
                response = fetch()
                times.append((time.perf_counter() - start) * 1000)
            queries = len(ctx.captured_queries)
        status = "" if response.status_code == 200 else f"  (HTTP {response.status_code})"
        label = f"{url}  (first byte)" if first_byte else url
        self.stdout.write(f"{statistics.median(times):9.0f} {queries:7d}  {label}{status}")

    def placeholders(self) -> dict[str, str]:
        """The seeded load's payer and accounts (any user's when there is no seeded load)."""
        User = get_user_model()
        payer = User.objects.filter(username="bench-payer").first() or User.objects.order_by("id").first()
        source = Account.objects.filter(owner=payer).order_by("id").first() or Account.objects.order_by("id").first()
        payee = User.objects.filter(username="bench-payee").first()
        target = (Account.objects.filter(owner=payee).order_by("id").first() if payee else None) or source
        day = (timezone.now() - timedelta(days=10)).date().isoformat()
        return {"payer": payer.pk if payer else 0, "source": source.pk if source else "", "target": target.pk if target
                else "", "day": day}

    def seed(self, count: int) -> None:
        if not settings.DEBUG:
            raise CommandError("--seed writes synthetic payments: development databases only (DJANGO_DEBUG=1)")
        User = get_user_model()
        payer, _ = User.objects.get_or_create(username="bench-payer")
        payee, _ = User.objects.get_or_create(username="bench-payee")
        source = Account.objects.filter(owner=payer).first() or account_create(owner=payer, name="bench source")
        target = Account.objects.filter(owner=payee).first() or account_create(owner=payee, name="bench target")
        start = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(SEED_SQL, {"payer": payer.pk, "source": source.pk, "target": target.pk, "count": count})
            inserted = cur.rowcount
            cur.execute("ANALYZE payments_scheduledpayment")
        self.stdout.write(f"seeded {inserted} payments in {time.perf_counter() - start:.1f} s")
