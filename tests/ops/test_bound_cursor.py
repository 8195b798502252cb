"""common.db.bound_cursor's arrays (FastListDumper) read back in PostgreSQL as exactly
the lists that were sent, whatever their strings hold."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from psycopg.pq import Format
from psycopg.types.array import ListDumper

import common.db
from common.db import bound_cursor

pytestmark = pytest.mark.django_db

AWKWARD = [
    "pay_01M8QEDC000000000000000001", "", "NULL", "null", "a,b", " padded ", "{braces}", 'say "hi"',
    "back\\slash", "\\\"", "tab\there", "new\nline", "\u3000ideographic space", "é ü ß 日本", "'quoted'",
]


@pytest.mark.parametrize(
    ("values", "cast"),
    [
        (AWKWARD, "text[]"),
        (["plain", "ids", "only"], "text[]"),
        ([0, 1, -7, 2**62, -(2**62)], "bigint[]"),
        ([1, 2, 3], "int[]"),
        (["x", None, "NULL", 'a "b"'], "text[]"),
        ([None, None], "text[]"),
        ([datetime(2026, 12, 2, 3, 4, 5, 123456, tzinfo=UTC), None, datetime(1999, 1, 1, tzinfo=UTC)], "timestamptz[]"),
        ([datetime(2026, 12, 2, 3, 4, 5)], "timestamp[]"),
        ([1, None], "int[]"),
        ([True, False], "bool[]"),
    ],
)
def test_an_array_reads_back_as_the_list_sent(values, cast):
    with bound_cursor() as cur:
        cur.execute(f"SELECT %s::{cast}", [values])
        assert cur.fetchone()[0] == values


def test_plain_strings_and_ints_take_the_one_step_path(monkeypatch):
    # The reads above pass on the library's path too: make sure they took the fast one.
    def library_path(self, obj):
        raise AssertionError("ListDumper.dump called")

    monkeypatch.setattr(ListDumper, "dump", library_path)
    with bound_cursor() as cur:
        when = [datetime(2026, 12, 2, tzinfo=UTC), None]
        cur.execute("SELECT %s::text[], %s::bigint[], %s::timestamptz[], %s::text[]",
                    [AWKWARD, [1, 2], when, ["x", None]])
        assert cur.fetchone() == (AWKWARD, [1, 2], when, ["x", None])
        with pytest.raises(AssertionError, match=r"ListDumper\.dump called"):
            cur.execute("SELECT %s::text[]", [[["nested"]]])


def test_a_list_of_plain_strings_is_one_join(monkeypatch):
    # The check for quotes once looked at the joined text, whose own '","' separators
    # always matched: every list of two or more strings was escaped element by element.
    def escaped(item):
        raise AssertionError(f"escaped {item!r} one by one")

    monkeypatch.setattr(common.db, "_quoted", escaped)
    with bound_cursor() as cur:
        cur.execute("SELECT %s::text[]", [["pay_1", "pay_2", "", "EXECUTING"]])
        assert cur.fetchone()[0] == ["pay_1", "pay_2", "", "EXECUTING"]


def test_repeated_strings_with_quotes_are_escaped_once_each(monkeypatch):
    calls = []
    original = common.db._quoted

    def counting(item):
        calls.append(item)
        return original(item)

    monkeypatch.setattr(common.db, "_quoted", counting)
    data = ['{"outcome": "executed"}'] * 500 + ['{"outcome": "failed"}', 'back\\slash']
    with bound_cursor() as cur:
        cur.execute("SELECT %s::text[]", [data])
        assert cur.fetchone()[0] == data
    assert sorted(calls) == sorted(set(data))


def test_timestamps_read_as_djangos_cursor_reads_them():
    query = "SELECT now(), '2026-01-01 00:00:00+05'::timestamptz, ARRAY['1999-12-31 23:59:59.5-08'::timestamptz, NULL]"
    with bound_cursor() as cur:
        cur.execute(query)  # now(): the test's transaction's clock, the same in both reads
        bound = cur.fetchone()
        oid = cur.cursor.adapters.types["timestamptz"].oid
        loader = cur.cursor.adapters.get_loader(oid, Format.TEXT)
    with connection.cursor() as cur:
        cur.execute(query)
        django_read = cur.fetchone()
        django_loader = cur.cursor.adapters.get_loader(oid, Format.TEXT)
    # psycopg's own loader (in C with the binary build), not Django's Python subclass of it
    assert loader.__module__.startswith("psycopg") and not django_loader.__module__.startswith("psycopg")
    assert bound == django_read
    assert bound[1] == datetime(2025, 12, 31, 19, 0, tzinfo=UTC)
    assert all(value.tzinfo is UTC for value in (bound[0], bound[1], bound[2][0]))
