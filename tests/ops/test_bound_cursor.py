"""common.db.bound_cursor's arrays (FastListDumper) read back in PostgreSQL as exactly
the lists that were sent, whatever their strings hold."""

from datetime import UTC, datetime

import pytest
from psycopg.types.array import ListDumper

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
