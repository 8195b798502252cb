"""``manage.py bench_executor``: the executor's own cost, in-process, without Celery.

Loads N due payments on scratch tables of the configured database (truncating the
payments and ledger tables: never point it at a database you care about; it refuses
one whose name does not start with ``bench_`` or ``micro_``), then claims and runs
batches of 500 through ``payments.worker.run_batch`` (the start marker, the executor,
metrics) in this process, and prints payments/s of executing time. Meant for A/B runs
of two checkouts on the same machine: alternate their order and CHECKPOINT between
runs (the WAL of one run otherwise lands in the next one's time).
"""

import time
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from devtools.bench import loader
from payments.promoter import claim_due
from payments.worker import run_batch


class Command(BaseCommand):
    help = "Time the executor in-process on N due payments (scratch database only)."

    def add_arguments(self, parser):
        parser.add_argument("--payments", type=int, default=20_000)
        parser.add_argument("--accounts", type=int, default=2_000)
        parser.add_argument("--batch", type=int, default=500)

    def handle(self, *args, **opts):
        name = connection.settings_dict["NAME"]
        if not name.startswith(("bench_", "micro_")):
            raise CommandError(f"refusing to truncate {name!r}: use a database named bench_* or micro_*")
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE ledger_transfer DISABLE TRIGGER USER")
            cur.execute("TRUNCATE payments_paymentevent, payments_executionattempt, payments_scheduledpayment,"
                        " ledger_transfer CASCADE")
            cur.execute("ALTER TABLE ledger_transfer ENABLE TRIGGER USER")
            cur.execute("DELETE FROM ledger_account WHERE id LIKE 'acc_bench%%'")
        loader.load_accounts(accounts=opts["accounts"])
        loader.load_payments(payments=opts["payments"], accounts=opts["accounts"],
                             due_at=timezone.now() - timedelta(seconds=1))
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE payments_scheduledpayment")
            cur.execute("CHECKPOINT")
        done, executing = 0, 0.0
        while claim := claim_due(batch=opts["batch"], lease_seconds=600).fresh:
            started = time.perf_counter()
            run_batch(claim, worker="bench_executor")
            executing += time.perf_counter() - started
            done += len(claim)
        self.stdout.write(f"executor: {done} payments in {executing:.2f} s of executing = {done / executing:,.0f}/s")
