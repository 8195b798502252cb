"""``manage.py bench_executor``: the executor's own cost, in-process, without Celery.

Loads N due payments on scratch tables of the configured database (truncating the
payments and ledger tables: never point it at a database you care about; it refuses
one whose name does not start with ``bench_`` or ``micro_``), then claims and runs
batches of 500 through ``payments.worker.run_batch`` (the start marker, the executor,
metrics) in this process, and prints payments/s of executing time. Meant for A/B runs
of two checkouts on the same machine: alternate their order and CHECKPOINT between
runs (the WAL of one run otherwise lands in the next one's time). ``--statements``
also times every SQL statement of the batches (a Django ``execute_wrapper``) and prints
them by total time: where the executor's time goes, statement by statement.
"""

import contextlib
import time
from collections import Counter
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
        parser.add_argument("--statements", action="store_true",
                            help="time every SQL statement of the batches and print them by total time")

    def handle(self, *args, **opts):
        name = connection.settings_dict["NAME"]
        if not name.startswith(("bench_", "micro_")):
            raise CommandError(f"refusing to truncate {name!r}: use a database named bench_* or micro_*")
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE ledger_transfer DISABLE TRIGGER USER")
            cur.execute("TRUNCATE payments_paymentevent, payments_executionattempt, payments_scheduledpayment,"
                        " payments_startmarker, ledger_transfer CASCADE")
            cur.execute("ALTER TABLE ledger_transfer ENABLE TRIGGER USER")
            cur.execute("DELETE FROM ledger_account WHERE id LIKE 'acc_bench%%'")
        loader.load_accounts(accounts=opts["accounts"])
        loader.load_payments(payments=opts["payments"], accounts=opts["accounts"],
                             due_at=timezone.now() - timedelta(seconds=1))
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE payments_scheduledpayment")
            cur.execute("CHECKPOINT")
        done, executing = 0, 0.0
        seconds, calls = Counter(), Counter()

        def timed(execute, sql, params, many, context):
            key = " ".join(sql.split())[:90]
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                seconds[key] += time.perf_counter() - started
                calls[key] += 1

        while claim := claim_due(batch=opts["batch"], lease_seconds=600).fresh:
            hook = connection.execute_wrapper(timed) if opts["statements"] else contextlib.nullcontext()
            started = time.perf_counter()
            with hook:
                run_batch(claim, worker="bench_executor")
            executing += time.perf_counter() - started
            done += len(claim)
        self.stdout.write(f"executor: {done} payments in {executing:.2f} s of executing = {done / executing:,.0f}/s")
        if opts["statements"]:
            self.stdout.write(f"in statements {sum(seconds.values()):.2f} s (the rest: commits and Python)")
            for key, total in seconds.most_common():
                self.stdout.write(f"{total:7.2f} s {calls[key]:6d}x  {key}")
