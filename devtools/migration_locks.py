"""What each migration would lock, read from the SQL it runs.

A statement that holds a table which existed before the migration for a time that grows
with the table is a finding (docs/reference/migrations.md, "blocking"):

* an index built without ``CONCURRENTLY`` (a ``SHARE`` lock: every write waits);
* a column's type changed (a rewrite under ``ACCESS EXCLUSIVE``);
* a ``CHECK`` or foreign key added without ``NOT VALID`` (validated by a scan under the lock);
* ``SET NOT NULL`` (a scan under ``ACCESS EXCLUSIVE``);
* a column added with a volatile default (``now()``, ``random()``, ...: a rewrite);
* ``VACUUM FULL``, ``CLUSTER``, an explicit ``LOCK TABLE``;
* a backfill: ``UPDATE`` of, or ``INSERT ... SELECT`` into, a table (its rows stay locked
  until the migration commits).

Tables the same migration creates are empty, so nothing on them counts. The statements are
the ones ``migrate`` sends, recorded on the connection while it migrates an empty
database (``migration_sql``), the queries of Python operations (``RunPython``) included.
``tests/ops/test_migration_safety.py`` holds every migration to it.
"""

import re
from contextlib import contextmanager
from dataclasses import dataclass

NAME = r'(?:"?\w+"?\.)?"?(?P<table>\w+)"?'
_BODIES = re.compile(r"\$(\w*)\$.*?\$\1\$", re.S)  # function bodies: their text is not DDL run now
_CREATE_TABLE = re.compile(rf"CREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{NAME}", re.I)
_CREATE_INDEX = re.compile(
    rf"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?P<concurrently>CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\"?\w*\"?\s*"
    rf"ON\s+(?:ONLY\s+)?{NAME}", re.I)
_ALTER_TABLE = re.compile(rf"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?{NAME}(?P<rest>[^;]*)", re.I)
_ALTER_RULES = [
    (re.compile(r"ALTER\s+COLUMN\s+\"?\w+\"?\s+(?:SET\s+DATA\s+)?TYPE\b", re.I), "a column's type changed (a rewrite)"),
    (re.compile(r"ADD\s+CONSTRAINT\s+\"?\w+\"?\s+(?:CHECK|FOREIGN\s+KEY)(?![^;]*NOT\s+VALID)", re.I),
     "a CHECK or foreign key validated as it is added (a scan under the lock; add it NOT VALID)"),
    (re.compile(r"SET\s+NOT\s+NULL", re.I), "SET NOT NULL (a scan under ACCESS EXCLUSIVE)"),
    (re.compile(r"ADD\s+COLUMN[^,;]*DEFAULT\s+\(?\s*(?:now|random|clock_timestamp|statement_timestamp|"
                r"gen_random_uuid|uuid_generate_v4|nextval)\s*\(", re.I),
     "a column added with a volatile default (a rewrite)"),
]
_BACKFILLS = [re.compile(rf"^\s*UPDATE\s+(?:ONLY\s+)?{NAME}", re.I),
              re.compile(rf"^\s*INSERT\s+INTO\s+{NAME}[^;]*?\bSELECT\b", re.I | re.S)]
_WHOLE_TABLE = re.compile(rf"(?:VACUUM\s+FULL|CLUSTER|LOCK\s+TABLE)\s+(?:ONLY\s+)?{NAME}", re.I)


# The tables that grow with the money flow (docs/reference/migrations.md, "blocking"): a
# finding on one of them holds the money path for a time that grows with it.
LARGE_TABLES = frozenset({
    "payments_scheduledpayment", "payments_paymentevent", "payments_executionattempt", "ledger_transfer",
    "ledger_account", "webhooks_event",
})


@dataclass(frozen=True)
class Finding:
    table: str
    what: str


def findings(statements: list[str]) -> list[Finding]:
    """What the statements of one migration, in order, lock on tables it did not create."""
    created: set[str] = set()
    found: list[Finding] = []
    for statement in statements:
        text = _BODIES.sub("$$ $$", statement)
        created.update(m["table"] for m in _CREATE_TABLE.finditer(text))
        for m in _CREATE_INDEX.finditer(text):
            if not m["concurrently"] and m["table"] not in created:
                found.append(Finding(m["table"], "an index built without CONCURRENTLY (writes wait)"))
        for m in _ALTER_TABLE.finditer(text):
            if m["table"] not in created:
                found += [Finding(m["table"], what) for rule, what in _ALTER_RULES if rule.search(m["rest"])]
        found += [Finding(m["table"], "a backfill in the migration's transaction (rows locked until it commits)")
                  for m in (rule.match(text) for rule in _BACKFILLS) if m and m["table"] not in created]
        found += [Finding(m["table"], "the whole table locked or rebuilt")
                  for m in _WHOLE_TABLE.finditer(text) if m["table"] not in created]
    return found


@contextmanager
def scratch_database(name: str):
    """The default connection pointed at a new, empty database ``name`` (dropped after),
    then back at its own. The default one, not an alias: data migrations use the default
    alias (``Model.objects``), as ``migrate`` runs them."""
    from django.db import connections

    default = connections["default"]
    own = default.settings_dict["NAME"]
    quoted = default.ops.quote_name(name)
    with default.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cur.execute(f"CREATE DATABASE {quoted}")
    default.close()
    default.settings_dict["NAME"] = name
    try:
        yield default
    finally:
        default.close()
        default.settings_dict["NAME"] = own
        with default.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {quoted}")


def migration_sql(connection, apps: set[str]) -> dict[str, list[str]]:
    """Migrate ``connection``'s database, empty, to the latest, and return the statements
    each migration of ``apps`` ran (``app/migrations/NNNN_name.py``), its Python operations'
    queries included: what ``migrate`` sends, read off the connection."""
    from django.db.migrations.executor import MigrationExecutor

    ran: dict[str, list[str]] = {}
    current: list[str | None] = [None]

    def progress(action, migration=None, fake=False):
        if action == "apply_start" and migration.app_label in apps:
            current[0] = f"{migration.app_label}/migrations/{migration.name}.py"
            ran[current[0]] = []
        elif action == "apply_success":
            current[0] = None

    def record(execute, sql, params, many, context):
        if current[0] is not None:
            ran[current[0]].append(sql)
        return execute(sql, params, many, context)

    executor = MigrationExecutor(connection, progress_callback=progress)
    with connection.execute_wrapper(record):
        executor.migrate(executor.loader.graph.leaf_nodes())
    return ran
