"""Every migration's lock safety, read from the SQL it runs (devtools/migration_locks.py):
a migration that holds one of the large tables for a time that grows with it is marked
**blocking** in docs/reference/migrations.md; and a migration newer than 0.1.0 holds none
of them at all, unless its row plans for it ("before, with every process stopped")."""

import re

import pytest

from devtools.migration_locks import LARGE_TABLES, Finding, findings, migration_sql, scratch_database
from tests.ops.test_migrations_table import PAGE, listed

# The database is set up only for a run that has a django_db test (pytest-django).
pytestmark = pytest.mark.django_db

# The last migration of each app at tag v0.1.0 (CHANGELOG.md).
RELEASED = {"ledger": 8, "payments": 22, "webhooks": 6}


@pytest.fixture(scope="module")
def ran(django_db_setup, django_db_blocker):
    """The statements each migration ran, migrating an empty database of its own (3 s)."""
    with django_db_blocker.unblock(), scratch_database(f"{django_db_setup_name()}_migration_locks") as connection:
        return migration_sql(connection, {"ledger", "payments", "webhooks"})


def django_db_setup_name() -> str:
    from django.db import connection

    return connection.settings_dict["NAME"]


def on_large_tables(statements) -> list[Finding]:
    return [finding for finding in findings(statements) if finding.table in LARGE_TABLES]


def released(path: str) -> bool:
    app, number = re.match(r"(\w+)/migrations/(\d{4})_", path).groups()
    return int(number) <= RELEASED.get(app, 0)


def test_every_migration_that_holds_a_large_table_is_documented_blocking(ran):
    rows = listed(PAGE.read_text())
    assert set(ran) == set(rows)
    undocumented = {path: on_large_tables(sql) for path, sql in ran.items()
                    if on_large_tables(sql) and rows[path][0] != "**blocking**"}
    assert not undocumented


def test_a_migration_after_the_release_holds_no_large_table_unless_it_plans_for_it(ran):
    rows = listed(PAGE.read_text())
    unplanned = {path: on_large_tables(sql) for path, sql in ran.items() if not released(path)
                 and on_large_tables(sql) and rows[path][1] != "before, with every process stopped"}
    assert not unplanned


def test_the_check_finds_what_it_should():
    """Fed statements that lock and statements that do not."""
    bad = [
        'CREATE INDEX "x" ON "payments_scheduledpayment" ("amount")',
        'ALTER TABLE "ledger_transfer" ALTER COLUMN "amount" TYPE numeric',
        'ALTER TABLE "payments_paymentevent" ADD CONSTRAINT "c" CHECK ("id" > 0)',
        'ALTER TABLE "ledger_account" ADD CONSTRAINT "f" FOREIGN KEY ("owner_id") REFERENCES "auth_user" ("id")',
        'ALTER TABLE "webhooks_event" ALTER COLUMN "type" SET NOT NULL',
        'ALTER TABLE "payments_executionattempt" ADD COLUMN "at" timestamptz DEFAULT now() NOT NULL',
        'UPDATE "payments_scheduledpayment" SET "tries" = 0',
        'INSERT INTO "webhooks_event" (id) SELECT id FROM payments_scheduledpayment',
        'LOCK TABLE "ledger_transfer" IN ACCESS EXCLUSIVE MODE',
        'CREATE INDEX "y" ON "public"."payments_paymentevent" ("kind")',
    ]
    assert [len(findings([statement])) for statement in bad] == [1] * len(bad)
    fine = [
        'CREATE INDEX CONCURRENTLY "x" ON "payments_scheduledpayment" ("amount")',
        'ALTER TABLE "ledger_account" ADD CONSTRAINT "c" CHECK ("balance" > 0) NOT VALID',
        'ALTER TABLE "ledger_account" VALIDATE CONSTRAINT "c"',
        'ALTER TABLE "payments_scheduledpayment" ADD COLUMN "note" text NULL',
        'ALTER TABLE "payments_scheduledpayment" ADD COLUMN "n" integer DEFAULT 0 NOT NULL',
        'DROP INDEX "payments_old_idx"',
        "CREATE OR REPLACE FUNCTION f() RETURNS trigger AS $$ BEGIN UPDATE ledger_account SET x = 1; "
        "CREATE INDEX i ON ledger_account (x); END $$ LANGUAGE plpgsql",
        'INSERT INTO "ledger_account" ("id") VALUES (%s)',
    ]
    assert [findings([statement]) for statement in fine] == [[]] * len(fine)
    # A table the migration itself creates is empty: nothing on it counts.
    assert findings(['CREATE TABLE "t" ("id" integer)', 'CREATE INDEX "i" ON "t" ("id")',
                     'ALTER TABLE "t" ALTER COLUMN "id" SET NOT NULL']) == []
