"""Archival of a month (``bench archive``): how long ``partitions.archive_month`` takes for
one month of ``--history`` finished payments (1,000,000), and that reconciliation still
passes on what remains.

In a fresh scratch database: the payments, made last month with what the engine leaves
of each (three events, an attempt, its transfer: loader.load_history), then fresh
statistics and a checkpoint. Timed: the whole archive_month (export of the four
partitions to gzipped CSV with their SHA-256, the read-back check, the detach and drop),
then ``reconcile()`` over what remains (the ledger still holds every transfer; the
archived month's totals are checked against it). Figures: seconds, rows and bytes per
second, the files' sizes, and the database's size before and after.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from django.db import connection
from django.utils import timezone

from payments import partitions
from payments.reconciliation import reconcile

from . import loader
from .scenarios import STORED_TABLES
from .scratch import fresh_database, scratch_name


@dataclass
class ArchiveOptions:
    payments: int = 1_000_000
    accounts: int = 10_000
    keep: bool = False


def database_bytes() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_database_size(current_database())")
        return cur.fetchone()[0]


def stored_rows() -> dict[str, int]:
    with connection.cursor() as cur:
        out = {}
        for table in (*STORED_TABLES, "webhooks_event"):
            cur.execute(f"SELECT count(*) FROM {table}")  # nosec B608 (our own table names)
            out[table] = cur.fetchone()[0]
        return out


def run(opts: ArchiveOptions, *, redis_url: str, log_dir: Path, run_id: str, say) -> dict:
    out: dict = {"scenario": "archive", "payments": opts.payments, "accounts": opts.accounts}
    with fresh_database(scratch_name(run_id, "archive"), keep=opts.keep):
        loader.load_accounts(accounts=opts.accounts)
        say(f"loading {opts.payments:,} finished payments made last month")
        out["history"] = loader.load_history(payments=opts.payments, accounts=opts.accounts, months=1, say=say)
        loader.analyze()
        with connection.cursor() as cur:
            cur.execute("CHECKPOINT")
        month = partitions.existing_months()[0]
        out["month"] = month.label
        out["rows_before"] = stored_rows()
        out["database_bytes_before"] = database_bytes()
        say(f"archiving {month.label}")
        started = time.monotonic()
        archived = partitions.archive_month(month, cutoff=timezone.now(), directory=log_dir / "archive")
        out["archive_s"] = round(time.monotonic() - started, 2)
        out["archive_steps_s"] = archived.timings
        manifest = archived.manifest
        files = {table: (log_dir / "archive" / month.name() / entry["file"]).stat().st_size
                 for table, entry in manifest["tables"].items()}
        rows = sum(entry["rows"] for entry in manifest["tables"].values())
        out.update({
            "rows_archived": {table: entry["rows"] for table, entry in manifest["tables"].items()},
            "rows_per_s": round(rows / out["archive_s"]),
            "file_bytes": files,
            "rows_after": stored_rows(),
            "database_bytes_after": database_bytes(),
        })
        say("reconciling what remains")
        started = time.monotonic()
        report = reconcile()
        out["reconcile_s"] = round(time.monotonic() - started, 2)
        out["reconcile_violations"] = {c.name: c.count for c in report.checks if not c.ok}
        out["correct"] = report.ok and out["rows_after"]["payments_scheduledpayment"] == 0
    return out


def summary(out: dict) -> str:
    mb = 1024 * 1024
    return "\n".join([
        "== archive ==",
        f"month               {out['month']}: {out['payments']:,} finished payments "
        f"(loaded in {out['history']['load_s']:,.0f} s)",
        "rows archived       " + ", ".join(f"{t} {n:,}" for t, n in out["rows_archived"].items()),
        f"archive_month       {out['archive_s']:.1f} s ({out['rows_per_s']:,} rows/s: export, read-back check, "
        "detach, drop)",
        f"steps               export {out['archive_steps_s']['export']:.1f} s, read-back check "
        f"{out['archive_steps_s']['verify']:.1f} s, detach and drop {out['archive_steps_s']['detach']:.3f} s "
        "(the tables locked)",
        f"files               {sum(out['file_bytes'].values()) / mb:,.0f} MB gzipped CSV",
        f"database            {out['database_bytes_before'] / mb:,.0f} MB -> "
        f"{out['database_bytes_after'] / mb:,.0f} MB",
        f"reconcile after     {out['reconcile_s']:.1f} s, violations {out['reconcile_violations'] or 'none'}",
        f"correct             {out['correct']}",
    ])
