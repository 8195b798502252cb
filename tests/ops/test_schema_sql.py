"""schema/*.sql holds the current text of every function, trigger and statistics object the
migrations make (STYLE.md: migrations embed frozen copies, the file is the current one).

The check is exact and made by PostgreSQL itself: inside a savepoint, every function,
trigger and statistics object of ours is dropped, the files are run, and the catalog's
definitions (pg_get_functiondef, pg_get_triggerdef, pg_get_statisticsobjdef) are read
again and compared with those the migrations left, then everything is rolled back. A
function or trigger the migrations made that the files lack fails, so does one the files
hold that the database does not have, and so does any difference in a definition
(whitespace apart)."""

import re
from pathlib import Path

import pytest
from django.db import connection, transaction

from webhooks import events

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schema"
FILES = ("ledger.sql", "payments.sql", "webhooks.sql")

# Ours: the public schema's, not an extension's; a partition's cloned trigger is its parent's.
FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public'
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
"""
TRIGGERS = """
SELECT format('%I ON %s', t.tgname, t.tgrelid::regclass), pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND NOT t.tgisinternal AND t.tgparentid = 0
"""
STATISTICS = """
SELECT format('%I', s.stxname), pg_get_statisticsobjdef(s.oid)
  FROM pg_statistic_ext s JOIN pg_class c ON c.oid = s.stxrelid JOIN pg_namespace n ON n.oid = s.stxnamespace
 WHERE n.nspname = 'public' AND NOT c.relispartition
"""
KINDS = {"function": FUNCTIONS, "trigger": TRIGGERS, "statistics": STATISTICS}


class _Rollback(Exception):
    pass


def _normalise(definition: str) -> str:
    return " ".join(definition.split())


def catalog(cur) -> dict[tuple[str, str], str]:
    """(kind, name) -> definition, as PostgreSQL prints it, of every object of ours."""
    found = {}
    for kind, query in KINDS.items():
        cur.execute(query)
        found |= {(kind, name): _normalise(definition) for name, definition in cur.fetchall()}
    return found


def catalog_from(sql: str) -> dict[tuple[str, str], str]:
    """What the catalog would hold if ``sql`` alone had made our functions, triggers and
    statistics: made in a savepoint that is rolled back."""
    result = {}
    try:
        with transaction.atomic(), connection.cursor() as cur:
            before = catalog(cur)
            for kind, name in before:
                if kind == "trigger":
                    cur.execute(f"DROP TRIGGER {name}")
            for kind, name in before:
                if kind == "statistics":
                    cur.execute(f"DROP STATISTICS {name}")
                elif kind == "function":
                    cur.execute(f"DROP FUNCTION {name} CASCADE")
            cur.execute(sql)
            result = catalog(cur)
            raise _Rollback
    except _Rollback:
        pass
    return result


def differences(live: dict, written: dict) -> dict[str, list]:
    return {
        "missing from schema/": sorted(set(live) - set(written)),
        "not in the database": sorted(set(written) - set(live)),
        "different": sorted(key for key in set(live) & set(written) if live[key] != written[key]),
    }


def schema_sql() -> str:
    return "\n".join((SCHEMA / name).read_text() for name in FILES)


def live_catalog() -> dict:
    with connection.cursor() as cur:
        return catalog(cur)


@pytest.mark.django_db
def test_the_schema_files_hold_every_function_trigger_and_statistics_as_the_database_has_them():
    live = live_catalog()
    kinds = {kind for kind, _ in live}
    assert kinds == {"function", "trigger", "statistics"} and len(live) > 25
    found = differences(live, catalog_from(schema_sql()))
    assert found == {"missing from schema/": [], "not in the database": [], "different": []}
    # The files ran to the same catalog: nothing was left over from the migrations.
    assert live_catalog() == live


@pytest.mark.django_db
def test_the_comparison_fails_on_a_changed_a_missing_and_an_extra_definition():
    """Fed deliberately different files, the check names each difference."""
    live = live_catalog()
    sql = schema_sql()
    changed = sql.replace("('deposit', 'deposit_approved', 'freeze', 'unfreeze')", "('deposit', 'freeze')")
    changed = changed.replace("'payment % cannot be deleted'", "'payment % may not be deleted'")
    assert changed.count("may not be deleted") == 1
    start = changed.index("CREATE OR REPLACE FUNCTION ledger_account_never_deleted()")
    marker = "EXECUTE FUNCTION ledger_account_never_deleted();"
    end = changed.index(marker) + len(marker)
    without = changed[:start] + changed[end:]
    extra = "CREATE FUNCTION payments_unknown() RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$;"
    found = differences(live, catalog_from(without + "\n" + extra))
    assert found == {
        "missing from schema/": [
            ("function", "ledger_account_never_deleted()"),
            ("trigger", "ledger_account_never_deleted ON ledger_account"),
        ],
        "not in the database": [("function", "payments_unknown()")],
        "different": [
            ("function", "payments_scheduledpayment_guard()"),
            ("trigger", "ledger_staffaction_not_for_self ON ledger_staffaction"),
        ],
    }


def _functiondef(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_functiondef(%s::regproc)", [name])
        return cur.fetchone()[0]


def payment_kind_to_type(functiondef: str) -> dict[str, str]:
    """The payment outbox function's CASE, as a map; only the kinds its WHERE lets through."""
    (kinds,) = re.findall(r"WHERE e\.kind IN \(([^)]*)\)", functiondef)
    mapping = dict(re.findall(r"WHEN '(\w+)' THEN '([\w.]+)'", functiondef))
    return {kind: mapping.get(kind) for kind in re.findall(r"'(\w+)'", kinds)}


def test_the_mapping_check_sees_a_case_that_disagrees():
    text = (SCHEMA / "webhooks.sql").read_text()
    source = text[text.index("FUNCTION webhooks_payment_outbox") : text.index("CREATE TRIGGER webhooks_payment_outbox")]
    assert payment_kind_to_type(source) == events.PAYMENT_KIND_TO_TYPE
    wrong_type = source.replace("THEN 'payment.needs_review'", "THEN 'payment.parked'")
    one_more = source.replace("'parked', 'updated')", "'parked', 'updated', 'redriven')")
    for changed in (wrong_type, one_more):
        assert payment_kind_to_type(changed) != events.PAYMENT_KIND_TO_TYPE


@pytest.mark.django_db
def test_the_outbox_triggers_map_kinds_to_types_as_events_py_does():
    """The kind -> type mapping is written twice, webhooks/events.py's maps and the live
    trigger functions' SQL (a CASE for payments, a prefix for series): they agree, and so
    do the CHECK constraints that list the types."""
    payment = _functiondef("webhooks_payment_outbox")
    assert payment_kind_to_type(payment) == events.PAYMENT_KIND_TO_TYPE

    recurring = _functiondef("webhooks_recurring_outbox")
    (kinds,) = re.findall(r"WHERE e\.kind IN \(([^)]*)\)", recurring)
    assert {f"recurring_payment.{k}" for k in re.findall(r"'(\w+)'", kinds)} == set(
        events.RECURRING_KIND_TO_TYPE.values()
    )
    assert {f"recurring_payment.{k}" for k in events.RECURRING_KIND_TO_TYPE} == set(
        events.RECURRING_KIND_TO_TYPE.values()
    )
    assert recurring.count("'recurring_payment.' || e.kind") == 2  # the type, and the subscription test

    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname IN ('webhooks_event_type_valid', 'webhooks_endpoint_events_known')"
        )
        checks = dict(cur.fetchall())
    assert len(checks) == 2
    for definition in checks.values():
        assert set(re.findall(r"'([\w.]+)'", definition)) == set(events.EVENT_TYPES)
