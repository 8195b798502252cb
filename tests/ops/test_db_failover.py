"""common/db_failover.py: every new connection of a serving process is counted, and one that
reached another server than the process's previous connection counts a primary change.
The whole path, against a real pg_auto_failover cluster, is the failover run's
(tests/ha/test_stack_failover.py); here the bookkeeping and a real connection."""

import os

import pytest
from django.db import connection

from common import db_failover
from tests.ops.scrape import delta, scrape


def test_a_new_connection_on_another_server_is_a_primary_change():
    db_failover._last.clear()
    try:
        assert not db_failover.observe("default", ("10.0.0.1", 5432))  # the first: nothing to compare
        assert not db_failover.observe("default", ("10.0.0.1", 5432))  # the same server again
        assert db_failover.observe("default", ("10.0.0.2", 5432))  # another: the primary changed
        assert not db_failover.observe("replica", ("10.0.0.9", 5432))  # each alias its own
        # A forked child's first connection is its first, whatever its parent's was.
        db_failover._last["default"] = (os.getpid() + 1, ("10.0.0.7", 5432))
        assert not db_failover.observe("default", ("10.0.0.2", 5432))
    finally:
        db_failover._last.clear()


@pytest.mark.django_db(transaction=True)
def test_each_new_connection_is_counted_and_asked_which_server_it_reached():
    db_failover.install()
    try:
        before = scrape()
        connection.close()
        connection.ensure_connection()
        reached = db_failover._last["default"]
        assert reached[0] == os.getpid()
        with connection.cursor() as cur:
            cur.execute("SELECT inet_server_port()")
            assert reached[1][1] == cur.fetchone()[0]
        connection.close()
        connection.ensure_connection()  # the same server: a reconnect, no primary change
        after = scrape()
        assert delta(after, before, "delaypay_db_connections_opened_total") >= 2
        assert delta(after, before, "delaypay_db_primary_changes_total") == 0
    finally:
        db_failover.uninstall()
        connection.close()
