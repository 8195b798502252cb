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

Only statements written for it: the ``%s``/``%(name)s`` placeholders of the modules' SQL
are psycopg's, which both bindings read the same way, but a placeholder inside a literal
or in a utility statement (``SET``) works with client-side binding only.
"""

import psycopg
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper


def bound_cursor() -> CursorWrapper:
    """A cursor of the default connection with server-side binding (use it as ``with``)."""
    connection.ensure_connection()
    return CursorWrapper(psycopg.Cursor(connection.connection), connection)


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
