"""The client-side deadline (common/db_deadline.py) against a real frozen server: the
PostgreSQL backend of our connection is stopped with SIGSTOP, so that its socket stays
open and its kernel acknowledges everything, exactly as a frozen primary's does. The
watchdog cuts the command; a connection busy with many short commands, or idle inside a
transaction, is never cut; and the next use of the connection gets a new one."""

import contextlib
import os
import signal
import time

import pytest
from django.db import OperationalError, close_old_connections, connection

from common import db_deadline
from tests.concurrency import other_session
from tests.ops.scrape import delta, scrape

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
DEADLINE = 0.5


@pytest.fixture
def watched():
    """A deadline of DEADLINE s on this process's connections, from a new connection on."""
    db_deadline.install(DEADLINE)
    connection.close()
    connection.ensure_connection()
    try:
        yield
    finally:
        db_deadline.uninstall()
        connection.close()


@contextlib.contextmanager
def frozen_backend():
    """Our connection's backend stopped (SIGSTOP) until the block ends, then ended."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
        with other_session() as other:
            other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def test_a_command_a_frozen_server_never_answers_is_cut_and_the_next_use_reconnects(watched):
    before = scrape()
    with frozen_backend():
        started = time.monotonic()
        with pytest.raises(OperationalError), connection.cursor() as cur:
            cur.execute("SELECT 1")
        waited = time.monotonic() - started
    # Cut after the deadline (by a watchdog that looks every DEADLINE/4 s), not never;
    # the upper bound leaves room for a loaded machine.
    assert DEADLINE <= waited < 10
    assert delta(scrape(), before, "delaypay_db_commands_cut_total") == 1
    close_old_connections()  # what the next request or task does first
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


def test_a_commit_a_frozen_server_never_answers_is_cut(watched):
    connection.set_autocommit(False)
    with connection.cursor() as cur:
        cur.execute("SELECT txid_current()")
    with frozen_backend(), pytest.raises(OperationalError):
        connection.commit()
    connection.close()


def test_many_short_commands_and_an_idle_transaction_are_never_cut(watched):
    before = scrape()
    ends = time.monotonic() + DEADLINE * 4
    with connection.cursor() as cur:
        while time.monotonic() < ends:  # always busy, never with one command for long
            cur.execute("SELECT pg_sleep(0.05)")
    connection.set_autocommit(False)
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    time.sleep(DEADLINE * 3)  # idle in a transaction: our own code's time, not the server's
    connection.commit()
    connection.set_autocommit(True)
    assert delta(scrape(), before, "delaypay_db_commands_cut_total") == 0


def test_a_forked_child_watches_its_own_connections(watched):
    """A prefork worker's child: the parent's thread does not survive the fork."""
    connection.close()
    pid = os.fork()
    if pid == 0:  # the child: a connection of its own, frozen, must be cut
        status = 1
        try:
            connection.connection = None
            connection.ensure_connection()
            with frozen_backend(), connection.cursor() as cur:
                try:
                    cur.execute("SELECT 1")
                except OperationalError:
                    status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db_deadline.current() is not None


@pytest.mark.django_db(transaction=True)
def test_a_maintenance_task_runs_unbounded():
    """Reconciliation and archival may take minutes on a large database: unbounded()."""
    db_deadline.install(DEADLINE)
    try:
        connection.close()
        connection.ensure_connection()
        before = scrape()
        with db_deadline.unbounded(), connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(%s)", [DEADLINE * 3])
        with pytest.raises(OperationalError), connection.cursor() as cur:  # bounded again after
            cur.execute("SELECT pg_sleep(%s)", [DEADLINE * 10])
        assert delta(scrape(), before, "delaypay_db_commands_cut_total") == 1
    finally:
        db_deadline.uninstall()
        connection.close()
