"""Database helpers: server-side parameter binding for the hot path's set-based
statements, and batched deletes for the purges.

Django's psycopg backend binds parameters on the client (``ClientCursor``): each
statement's parameters are quoted into its text. For the executor's statements, whose
parameters are arrays of hundreds of ids, that quoting was a fifth of a worker's time
(``PostgresClientQuery.convert``, ``ListDumper._dump_list``; docs/explanation/performance.md).
``bound_cursor`` runs them with the parameters sent apart from the text (``$1``...), on the
same connection and in the same transaction as Django's own cursors, and through Django's
``CursorWrapper``, so errors are Django's (``OperationalError`` and the rest, which the
worker's retry handling catches) and ``execute_wrapper`` hooks still see every statement.

The arrays themselves are written by ``FastListDumper``: psycopg's text array dumper
calls a dumper and a regular expression for each element, which for the executor's
35 arrays of 500 elements a batch was a third of the worker's own CPU
(docs/explanation/performance.md); lists of plain ``str`` or ``int`` are joined in one
step instead, everything else goes the library's way.

Rows come back through psycopg's own ``timestamptz`` loader (in C with psycopg's binary
build) rather than the Python subclass Django registers on its connections, which loads
each value and then replaces its tzinfo: for the 2,000 timestamps of the fence's rows a
batch that subclass was a tenth of a worker's busy time (``py-spy`` of
``bench_executor``). The two read the same values: Django sets the session's time zone
to UTC, and psycopg gives a UTC session's values ``datetime.timezone.utc``, as Django
does (``bound_cursor`` refuses a connection whose session is in another zone).

Its statements are also prepared on the server (``PreparingCursor``, decision 0013): each
is parsed once per connection, and PostgreSQL may keep one generic plan for it.

Only statements written for it: the ``%s``/``%(name)s`` placeholders of the modules' SQL
are psycopg's, which both bindings read the same way, but a placeholder inside a literal
or in a utility statement (``SET``) works with client-side binding only.
"""

from datetime import UTC, datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from psycopg.types.array import ListDumper
from psycopg.types.datetime import TimestamptzLoader


def _quoted(item: str) -> str:
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


# How one element of each plain kind is written inside the array's braces (a datetime
# as psycopg's own dumper writes it, str(); quoted for its space).
_ELEMENT = {
    str: _quoted,
    int: str,
    datetime: lambda item: '"' + str(item) + '"',
    type(None): lambda item: "NULL",
}


class FastListDumper(ListDumper):
    """psycopg's text array dumper, with one step for a list of ``str``, ``int`` or
    ``datetime`` (and None).

    Every string is double-quoted, which PostgreSQL's array input reads back as exactly
    that string (whitespace, commas, braces, the empty string and the word NULL
    included); only ``"`` and ``\\`` need a backslash inside quotes. A list of strings
    with neither is one join; the others escape each distinct string once. Anything else
    (nested lists, mixed kinds, other types, ``str`` subclasses such as Django's choices)
    goes through ``ListDumper``."""

    def __init__(self, cls, context=None):
        super().__init__(cls, context)
        # The strings are encoded here: only for a connection known to speak UTF-8.
        self._utf8 = self.connection is not None and self.connection.info.encoding == "utf-8"

    def dump(self, obj: list) -> bytes | None:
        if not obj or self.delimiter != b"," or not self._utf8:
            return super().dump(obj)
        kinds = set(map(type, obj))
        if kinds == {str}:
            everything = "".join(obj)
            if '"' in everything or "\\" in everything:
                # Each distinct string escaped once: the lists that hold quotes are mostly
                # one JSON text repeated (the events' data).
                quoted = {item: _quoted(item) for item in set(obj)}
                return ("{" + ",".join(map(quoted.__getitem__, obj)) + "}").encode()
            return ('{"' + '","'.join(obj) + '"}').encode()
        if kinds == {int}:
            return ("{" + ",".join(map(str, obj)) + "}").encode()
        if len(kinds - {type(None)}) <= 1 and kinds <= _ELEMENT.keys():
            return ("{" + ",".join([_ELEMENT[type(item)](item) for item in obj]) + "}").encode()
        return super().dump(obj)


class PreparingCursor(psycopg.Cursor):
    """A cursor whose statements are prepared on the server at their first run on a
    connection and executed by name after: no parse, and after five runs PostgreSQL may
    keep one generic plan instead of planning each batch (planning was 6.5 % of the
    database's CPU in a burst; docs/explanation/performance.md, "Issue 17, the seventh
    stop"). psycopg keeps the names per connection (at most ``prepared_max``, the least
    recently used dropped); PostgreSQL plans again after DDL on a table a statement reads.
    Only for the statements ``bound_cursor`` runs: set-based, written for it, the same
    text every batch."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)


# psycopg prepares nothing on a connection whose threshold is None (Django's default); a
# threshold no statement reaches lets PreparingCursor's statements be prepared and leaves
# every other statement as it was (Django's cursors bind on the client and never prepare).
_PREPARE_ONLY_WHEN_ASKED = 2**31


def bound_cursor() -> CursorWrapper:
    """A cursor of the default connection with server-side binding and prepared
    statements (use it as ``with``)."""
    # The connection itself, not the ``connection`` proxy: the wrapper reads its
    # attributes on every statement, and each read through the proxy looks the alias up in
    # asgiref's context-local storage (7 % of the executor's Python samples).
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    if db.timezone is not UTC:
        raise RuntimeError(f"bound_cursor reads timestamps as UTC; the connection's zone is {db.timezone}")
    if db.connection.prepare_threshold is None:
        db.connection.prepare_threshold = _PREPARE_ONLY_WHEN_ASKED
    cursor = PreparingCursor(db.connection)
    cursor.adapters.register_dumper(list, FastListDumper)
    cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    return CursorWrapper(cursor, db)


def delete_in_batches(statement: str, params: list, *, batch: int) -> int:
    """Run ``statement``, a DELETE of at most ``batch`` rows, one transaction at a time,
    until it deletes fewer than ``batch`` (so no lock is held for long). Returns the count."""
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(statement, params)
            deleted += cur.rowcount
            if cur.rowcount < batch:
                return deleted


def database_now(cur=None, *, clock: bool = False) -> datetime:
    """The database's time, the only clock that decides what is due.

    ``now()`` by default: the start of the current transaction, the instant every row the
    transaction writes carries. With ``clock=True``, ``clock_timestamp()``: the instant of
    the call, which moves on while a long transaction runs (a token bucket refills, a
    cool-down ends). On ``cur`` when given (the caller's transaction), else on a cursor of
    the default connection."""
    statement = "SELECT clock_timestamp()" if clock else "SELECT now()"
    if cur is not None:
        cur.execute(statement)
        return cur.fetchone()[0]
    with connection.cursor() as own:
        own.execute(statement)
        return own.fetchone()[0]


def set_migration_lock_timeout(sender, *, using: str, **kwargs) -> None:
    """pre_migrate: each statement of ``migrate`` waits at most
    DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS for a lock and then fails (run the release
    again), so a migration that queues behind a long transaction never queues the money
    path behind itself. On the migration's session: PGOPTIONS cannot do it, since the
    database settings pass libpq's ``options`` (jit, idle_in_transaction_session_timeout),
    which wins over PGOPTIONS."""
    from django.conf import settings
    from django.db import connections

    milliseconds = int(settings.DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS * 1000)
    with connections[using].cursor() as cur:
        cur.execute("SELECT set_config('lock_timeout', %s, false)", [f"{milliseconds}ms"])


def reset_lock_timeout(sender, *, using: str, **kwargs) -> None:
    """post_migrate: the session's lock_timeout back to the server's default (a test run
    migrates the test database on the connection its tests then use)."""
    from django.db import connections

    with connections[using].cursor() as cur:
        cur.execute("RESET lock_timeout")
