"""PostgreSQL under pg_auto_failover (devtools/ha.py): synchronous replication keeps every
acknowledged commit through the primary's death (RPO 0), and a client that reconnects
through the multi-host URL writes again within 30 s.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from devtools import ha
from tests.replica.conftest import poll as wait_until

from .conftest import BASE_DIR, Writer, shut_down

pytestmark = pytest.mark.ha
# Issue 37: writes resume within this after the primary dies or freezes.
FAILOVER_BUDGET = 30.0


def test_up_prints_one_multi_host_url_that_reaches_the_primary(cluster):
    assert cluster.url == (
        f"postgresql://root@127.0.0.1:{cluster.base_port + 1},127.0.0.1:{cluster.base_port + 2}"
        "/delaypay?target_session_attrs=read-write"
    )
    status = ha.status(cluster.directory)
    assert status["in_sync"], status
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
        assert conn.info.port == {n["name"]: n["port"] for n in status["nodes"]}[status["primary"]]
        assert conn.execute("SHOW synchronous_standby_names").fetchone()[0].startswith("ANY 1 (")
        assert conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() == [("quorum",)]
        conn.execute("CREATE DATABASE ha_scratch")  # our role may create the tests' databases
        conn.execute("DROP DATABASE ha_scratch")


def test_django_settings_accept_the_multi_host_url(cluster):
    """django-environ splits the hosts and ports into HOST and PORT as comma lists, which
    libpq takes as they are; the URL's target_session_attrs becomes an OPTION."""
    script = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    cursor.execute('SELECT inet_server_port(), pg_is_in_recovery()')\n"
        "    print(*cursor.fetchone())\n"
        "print(connection.settings_dict['HOST'], connection.settings_dict['PORT'])\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("DATABASE_")}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=BASE_DIR, capture_output=True, text=True, timeout=60, check=False,
        env={**env, "DATABASE_URL": cluster.url, "DJANGO_SETTINGS_MODULE": "delaypay.settings"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = ha.status(cluster.directory)
    primary_port = {n["name"]: n["port"] for n in status["nodes"]}[status["primary"]]
    assert proc.stdout.splitlines() == [
        f"{primary_port} False", f"127.0.0.1,127.0.0.1 {cluster.base_port + 1},{cluster.base_port + 2}"
    ]


def present_on(cluster, node: str, table: str) -> set[int]:
    with psycopg.connect(cluster.node_dsn(node), autocommit=True) as conn:
        return {seq for (seq,) in conn.execute(f"SELECT seq FROM {table}")}


def fault(writer: Writer, kill) -> tuple[str, float, float]:
    """Let the writer commit, then ``kill()`` (which names the node it hit), and wait for the
    first commit acknowledged after that. (node hit, time of the fault, seconds to write)"""
    wait_until(lambda: len(writer.acks) >= 50, timeout=30, what="50 commits before the fault")
    hit = kill()
    killed_at = time.monotonic()  # after the signal: a commit acknowledged before it is not "after"
    first = wait_until(lambda: writer.acked_after(killed_at), timeout=FAILOVER_BUDGET + 15,
                       what="a commit after the fault")
    return hit, killed_at, first.at - killed_at


def failover(cluster, writer: Writer, sig: signal.Signals) -> tuple[str, str, float, float]:
    """``fault`` on the primary's whole node: (old primary, new primary, time, seconds to write)."""
    old, killed_at, seconds = fault(writer, lambda: ha.kill_primary(cluster.directory, sig))
    new = ha.wait_for_new_primary(cluster.directory, old, timeout=FAILOVER_BUDGET)
    return old, new, killed_at, seconds


def test_kill_9_of_the_primary_loses_no_acknowledged_commit(cluster):
    writer = Writer(cluster.url, "after_kill").start()
    try:
        old, new, killed_at, seconds = failover(cluster, writer, signal.SIGKILL)
        print(f"\nkill -9 of {old}: first commit through the URL {seconds:.1f} s later, on {new}"
              f" (port {writer.acked_after(killed_at).port})")
        wait_until(lambda: len([a for a in writer.acks if a.at > killed_at]) >= 20, timeout=20,
                   what="writes to go on")
    finally:
        writer.finish()
    acknowledged = {ack.seq for ack in writer.acks}
    assert acknowledged - present_on(cluster, new, "after_kill") == set()
    new_port = cluster.layout.port(new)
    assert {ack.port for ack in writer.acks if ack.sent > killed_at} == {new_port}
    assert seconds < FAILOVER_BUDGET



def test_kill_9_of_the_postmaster_alone_loses_no_acknowledged_commit(cluster):
    """Its keeper starts it again (crash recovery); or the monitor, seeing it down, fails
    over. Either way nothing acknowledged is lost and writes resume through the URL."""
    writer = Writer(cluster.url, "after_postmaster_kill").start()
    try:
        old, killed_at, seconds = fault(
            writer, lambda: ha.kill_primary(cluster.directory, signal.SIGKILL, postmaster_only=True))
        wait_until(lambda: len([a for a in writer.acks if a.at > killed_at]) >= 20, timeout=20,
                   what="writes to go on")
    finally:
        writer.finish()
    primary = ha.status(cluster.directory)["primary"]
    how = "restarted by its keeper" if primary == old else f"failed over to {primary}"
    first_port = writer.acked_after(killed_at).port
    print(f"\nkill -9 of {old}'s postmaster: {how}; first commit through the URL {seconds:.1f} s later,"
          f" on port {first_port}")
    acknowledged = {ack.seq for ack in writer.acks}
    assert acknowledged - present_on(cluster, primary, "after_postmaster_kill") == set()
    assert seconds < FAILOVER_BUDGET


def old_node_acks(cluster, node: str, stop: threading.Event, table: str) -> list[int]:
    """Commits tried directly on ``node`` (no target_session_attrs) until ``stop``: any that
    is acknowledged is a second read-write primary."""
    acked, seq = [], 1_000_000
    while not stop.is_set():
        seq += 1
        try:
            with psycopg.connect(cluster.node_dsn(node), autocommit=True, connect_timeout=2) as conn:
                timer = threading.Timer(2.0, shut_down, [conn])
                timer.start()
                try:
                    conn.execute(f"INSERT INTO {table} (seq, port) VALUES (%s, inet_server_port())", [seq])
                    acked.append(seq)
                finally:
                    timer.cancel()
        except psycopg.Error:
            pass
        stop.wait(0.2)
    return acked


def test_a_frozen_primary_is_replaced_and_rejoins_as_secondary(cluster):
    writer = Writer(cluster.url, "after_stop").start()
    layout = cluster.layout
    try:
        old, new, stopped_at, seconds = failover(cluster, writer, signal.SIGSTOP)
        print(f"\nSIGSTOP of {old}: first commit through the URL {seconds:.1f} s later, on {new}"
              f" (port {writer.acked_after(stopped_at).port})")
        time.sleep(max(0.0, stopped_at + 30 - time.monotonic()))
        stop_probe, probe_acks = threading.Event(), []
        probe = threading.Thread(
            target=lambda: probe_acks.extend(old_node_acks(cluster, old, stop_probe, "after_stop")))
        probe.start()
        ha.resume(cluster.directory)
        continued_at = time.monotonic()
        try:
            wait_until(lambda: ha.status(cluster.directory)["in_sync"], timeout=90,
                       what=f"{old} to rejoin as secondary", interval=0.5)
        finally:
            stop_probe.set()
            probe.join(timeout=30)
        print(f"{old} back in sync as secondary {time.monotonic() - continued_at:.1f} s after SIGCONT")
    finally:
        writer.finish()
    status = ha.status(cluster.directory)
    assert status["primary"] == new
    assert {n["name"]: n["reported"] for n in status["nodes"]} == {new: "primary", old: "secondary"}
    with psycopg.connect(cluster.node_dsn(old), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True
    # One read-write node at a time: nothing was acknowledged by the old primary once thawed,
    # and nothing by it after the new one took the first write.
    assert probe_acks == []
    first_on_new = min(a.sent for a in writer.acks if a.port == layout.port(new))
    assert [a.seq for a in writer.acks if a.sent > first_on_new and a.port != layout.port(new)] == []
    acknowledged = {ack.seq for ack in writer.acks}
    assert acknowledged - present_on(cluster, new, "after_stop") == set()
    assert seconds < FAILOVER_BUDGET
