"""The database's limit: pgbench doing one ledger transfer per transaction.

Run on the same PostgreSQL server in a scratch database of its own: 8 clients,
``-M prepared``, a custom script of exactly the ledger's writes (debit UPDATE, credit
UPDATE, INSERT of a transfer with a unique key) and nothing else — no funds check,
no status, no audit. delaypay's payments/s divided by this rate is the headline ratio.
"""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
from django.db import connection

from .scratch import create_database, drop_database, pg_env, scratch_name

SCHEMA = """
CREATE TABLE pgb_account (id int PRIMARY KEY, balance bigint NOT NULL, updated_at timestamptz NOT NULL);
CREATE TABLE pgb_transfer (
    id bigserial PRIMARY KEY,
    key text NOT NULL UNIQUE,
    debit_id int NOT NULL REFERENCES pgb_account,
    credit_id int NOT NULL REFERENCES pgb_account,
    amount bigint NOT NULL CHECK (amount > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgb_account SELECT g, 1000000000, now() FROM generate_series(1, %(accounts)s) AS g;
VACUUM ANALYZE pgb_account;
"""

# Debit and credit differ (the same trick as the loader's); deadlocks between clients
# taking the two rows in opposite orders are retried by pgbench (--max-tries).
SCRIPT = """\\set debit random(1, :accounts)
\\set credit 1 + (:debit + random(0, :accounts - 2)) % :accounts
\\set amount random(1, 100)
BEGIN;
UPDATE pgb_account SET balance = balance - :amount, updated_at = now() WHERE id = :debit;
UPDATE pgb_account SET balance = balance + :amount, updated_at = now() WHERE id = :credit;
INSERT INTO pgb_transfer (key, debit_id, credit_id, amount) VALUES (gen_random_uuid()::text, :debit, :credit, :amount);
END;
"""

TPS_RE = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")


def parse_tps(output: str) -> float:
    match = TPS_RE.search(output)
    if match is None:
        raise RuntimeError(f"could not read tps from pgbench output:\n{output[-2000:]}")
    return float(match.group(1))


def run_pgbench(
    *, run_id: str, accounts: int = 10_000, clients: int = 8, seconds: int = 15, log_dir: Path | None = None,
    tag: str = "",
) -> dict:
    """pgbench's one-transfer-per-transaction rate on this server, in its own database."""
    binary = shutil.which("pgbench") or "/usr/bin/pgbench"
    if not Path(binary).exists():
        raise RuntimeError("pgbench is not installed (apt-get install postgresql-client)")
    name = scratch_name(run_id, "pgbench")
    create_database(name)
    try:
        params = {**connection.get_connection_params(), "dbname": name}
        with psycopg.connect(**params, autocommit=True) as conn:
            for statement in SCHEMA.replace("%(accounts)s", str(int(accounts))).split(";"):
                if statement.strip():
                    conn.execute(statement)
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
            script.write(SCRIPT)
        command = [
            binary, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(seconds), "--max-tries", "10", "-D", f"accounts={accounts}",
            "-f", script.name, name,
        ]
        done = subprocess.run(command, env=pg_env(), capture_output=True, text=True, timeout=seconds + 120)
        Path(script.name).unlink(missing_ok=True)
        output = done.stdout + done.stderr
        if log_dir is not None:
            (Path(log_dir) / f"pgbench{'-' + tag if tag else ''}.log").write_text(" ".join(command) + "\n" + output)
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed ({done.returncode}):\n{output[-2000:]}")
        return {
            "tps": parse_tps(output),
            "clients": clients,
            "seconds": seconds,
            "command": " ".join([*command[:-2], "<script>", "<scratch db>"]),
        }
    finally:
        drop_database(name)
