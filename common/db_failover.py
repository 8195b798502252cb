"""Failovers and reconnects, as each serving process sees them.

Every new database connection of web, workers, promoter, payouts and webhooks is counted
(``delaypay_db_connections_opened_total``): each process opens one at start and one after
``DJANGO_CONN_MAX_AGE`` or ``DELAYPAY_DB_REUSE_MAX``, and after a lost connection; a
failover shows as every process reconnecting within seconds. A new connection also asks
which server it reached (``inet_server_addr()``, ``inet_server_port()``, one round trip,
once a connection); when that is not the server the process's previous connection
reached, the primary changed under it, a failover or a switchover
(``delaypay_db_primary_changes_total``, alert ``DelaypayDatabaseFailover``).

Installed with the client-side deadline (common/db_deadline.py) by delaypay/wsgi.py and
delaypay/celery.py, never by ``manage.py`` commands.
"""

import logging
import os

from django.db import DatabaseError
from django.db.backends.signals import connection_created
from prometheus_client import Counter

logger = logging.getLogger(__name__)

connections_opened_total = Counter(
    "delaypay_db_connections_opened",
    "Database connections a serving process opened (at start, after the connection's age "
    "limit, and after a lost one: a failover shows as every process reconnecting).",
)
primary_changes_total = Counter(
    "delaypay_db_primary_changes",
    "New connections that reached another server than the process's previous one: the "
    "primary changed (a failover or a switchover).",
)

_last: dict[str, tuple] = {}  # alias -> (pid, server) of the process's previous connection


def observe(alias: str, server: tuple) -> bool:
    """Record that this process's new connection on ``alias`` reached ``server``; True
    when its previous connection (in this process) had reached another one."""
    pid = os.getpid()
    previous = _last.get(alias)
    _last[alias] = (pid, server)
    return previous is not None and previous[0] == pid and previous[1] != server


def _on_connection_created(sender, connection, **_kwargs):
    connections_opened_total.inc()
    try:
        with connection.connection.cursor() as cur:  # the raw connection: no wrapper, no recursion
            cur.execute("SELECT inet_server_addr()::text, inet_server_port()")
            server = tuple(cur.fetchone())
    except DatabaseError:
        return
    except Exception:  # psycopg's own errors, below Django's wrapping: the next connection says
        logger.debug("could not tell which server a new connection reached", exc_info=True)
        return
    if observe(connection.alias, server):
        primary_changes_total.inc()
        logger.warning("the database primary changed: this process's new connection reached another server",
                       extra={"alias": connection.alias, "server": f"{server[0]}:{server[1]}"})


def install() -> None:
    connection_created.connect(_on_connection_created, dispatch_uid="delaypay-db-failover")


def uninstall() -> None:
    connection_created.disconnect(dispatch_uid="delaypay-db-failover")
    _last.clear()
