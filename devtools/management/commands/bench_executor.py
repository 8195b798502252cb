"""``manage.py bench_executor``: the executor's own cost, in-process, without Celery.

Loads N due payments on scratch tables of the configured database (truncating the
payments and ledger tables: never point it at a database you care about; it refuses
one whose name does not start with ``bench_`` or ``micro_``), then claims and runs
batches of 500 through ``payments.worker.run_batch`` (the start marker, the executor,
metrics) in this process, and prints payments/s of executing time and the CPU the
executor cost per payment, in this process and in its database backend (read from the
backend's process: the server must be on this machine). The CPU figures are steadier
than the rate on a shared machine. Meant for A/B runs
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
from devtools.bench.cpu import cpu_seconds
from devtools.bench.rss import psutil_module
from devtools.bench.scenarios import wal_position
from payments.promoter import claim_due
from payments.worker import run_batch


def _backend(conn):
    """This connection's PostgreSQL backend process (the server is on this machine)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return psutil_module().Process(cur.fetchone()[0])


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
            # The outbox too: each run adds a row per payment, and a log that grows from
            # run to run makes every later run pay for larger indexes.
            cur.execute("TRUNCATE payments_paymentevent, payments_executionattempt, payments_scheduledpayment,"
                        " payments_paymentlookup, payments_startmarker, ledger_transfer, webhooks_event CASCADE")
            cur.execute("ALTER TABLE ledger_transfer ENABLE TRIGGER USER")
            # Accounts are never deleted (ledger/migrations/0007); a scratch database's are.
            cur.execute("ALTER TABLE ledger_account DISABLE TRIGGER ledger_account_never_deleted")
            cur.execute("DELETE FROM ledger_account WHERE id LIKE 'acc_bench%%'")
            cur.execute("ALTER TABLE ledger_account ENABLE TRIGGER ledger_account_never_deleted")
        loader.load_accounts(accounts=opts["accounts"])
        loader.load_payments(payments=opts["payments"], accounts=opts["accounts"],
                             due_at=timezone.now() - timedelta(seconds=1))
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE payments_scheduledpayment")
            cur.execute("VACUUM ANALYZE ledger_account")  # the previous run's accounts, deleted above
            cur.execute("CHECKPOINT")
        done, executing, claiming, cpu, db_cpu, wal = 0, 0.0, 0.0, 0.0, 0.0, 0
        claim_db_cpu, claim_wal = 0.0, 0
        backend = _backend(connection)
        seconds, calls = Counter(), Counter()

        def timed(execute, sql, params, many, context):
            key = " ".join(sql.split())[:90]
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                seconds[key] += time.perf_counter() - started
                calls[key] += 1

        while True:
            started, started_db, started_wal = time.perf_counter(), cpu_seconds(backend), wal_position()
            claim = claim_due(batch=opts["batch"], lease_seconds=600).fresh
            claiming += time.perf_counter() - started
            claim_db_cpu += cpu_seconds(backend) - started_db
            claim_wal += wal_position() - started_wal
            if not claim:
                break
            hook = connection.execute_wrapper(timed) if opts["statements"] else contextlib.nullcontext()
            started_wal = wal_position()
            started, started_cpu, started_db = time.perf_counter(), time.process_time(), cpu_seconds(backend)
            with hook:
                run_batch(claim, worker="bench_executor")
            executing += time.perf_counter() - started
            cpu += time.process_time() - started_cpu
            db_cpu += cpu_seconds(backend) - started_db
            wal += wal_position() - started_wal
            done += len(claim)
        self.stdout.write(f"executor: {done} payments in {executing:.2f} s of executing = {done / executing:,.0f}/s"
                          f" (claiming them: {claiming:.2f} s)")
        self.stdout.write(f"CPU in the executor: this process {cpu / done * 1e6:.0f} us a payment,"
                          f" its database backend {db_cpu / done * 1e6:.0f} us a payment;"
                          f" WAL {wal / done:,.0f} bytes a payment")
        self.stdout.write(f"CPU in the claim: its database backend {claim_db_cpu / done * 1e6:.0f} us a payment;"
                          f" WAL {claim_wal / done:,.0f} bytes a payment")
        if opts["statements"]:
            self.stdout.write(f"in statements {sum(seconds.values()):.2f} s (the rest: commits and Python)")
            for key, total in seconds.most_common():
                self.stdout.write(f"{total:7.2f} s {calls[key]:6d}x  {key}")
