"""Redis behind Sentinel (devtools/ha.py): when the master dies, the sentinels promote the
replica, a client that follows the master name writes again, and what the replica had
acknowledged (WAIT 1) before the death is on the new master.
"""

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field

import kombu
import pytest
import redis
from redis.sentinel import Sentinel

from devtools import ha
from tests.replica.conftest import poll

pytestmark = pytest.mark.ha
FAILOVER_BUDGET = 30.0
REDIS_BASE_PORT = 56700  # the module's Redis set (conftest.py, redis_set)
WAIT_MS = 500


def test_the_printed_url_is_a_celery_broker_url(redis_set):
    ports = [redis_set.base_port + i for i in (2, 3, 4)]
    assert redis_set.url == ";".join(f"sentinel://127.0.0.1:{port}/0" for port in ports)
    with kombu.Connection(redis_set.url, transport_options={"master_name": ha.MASTER_NAME}) as conn:
        queue = conn.SimpleQueue("ha-test")
        queue.put({"hello": "sentinel"})
        message = queue.get(timeout=5)
        assert message.payload == {"hello": "sentinel"}
        message.ack()
        queue.close()


@dataclass
class RedisWriter:
    """SET k<n> then WAIT 1: a write is acknowledged once a replica has it.

    Each write is recorded as (n, sent, answered) on time.monotonic(): when SET was sent
    and when WAIT answered. Only the send time tells a write that began after the kill
    from one that ended after it: a reply read just before the kill can be recorded just
    after it, when the thread gets the GIL back (that write went to the old master).
    """

    sentinel: Sentinel
    acked: list[tuple[int, float, float]] = field(default_factory=list)
    written: list[tuple[int, float, float]] = field(default_factory=list)  # WAIT said 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        master = self.sentinel.master_for(ha.MASTER_NAME, socket_timeout=1, socket_connect_timeout=1)
        n = 0
        while not self.stop.is_set():
            n += 1
            sent = time.monotonic()
            try:
                master.set(f"k{n}", n)
                replicas = master.execute_command("WAIT", 1, WAIT_MS)
            except redis.RedisError:
                self.stop.wait(0.05)
                continue
            (self.acked if replicas >= 1 else self.written).append((n, sent, time.monotonic()))
        master.close()

    def first_sent_after(self, moment: float) -> float | None:
        """When the first write sent after ``moment`` was answered."""
        return min((answered for _, sent, answered in self.written + self.acked if sent > moment), default=None)


def test_the_replica_takes_over_and_keeps_what_was_acknowledged(redis_set):
    sentinel = Sentinel(redis_set.layout.sentinel_addresses, socket_timeout=1, socket_connect_timeout=1)
    writer = RedisWriter(sentinel)
    thread = threading.Thread(target=writer.run, name="redis-writer", daemon=True)
    thread.start()
    try:
        poll(lambda: len(writer.acked) >= 200, timeout=20, what="200 acknowledged writes")
        old_master = sentinel.discover_master(ha.MASTER_NAME)
        killed = ha.kill_redis_master(redis_set.directory, signal.SIGKILL)
        killed_at = time.monotonic()
        first = poll(lambda: writer.first_sent_after(killed_at), timeout=FAILOVER_BUDGET,
                     what="a write sent after the kill")
        print(f"\nkill -9 of the Redis master ({killed}): first write through Sentinel {first - killed_at:.1f} s later")
        # That write found a master through Sentinel, and the old one is dead; one sentinel
        # may still be learning of the promotion, so its answer is awaited, not assumed.
        new_master = poll(lambda: (m := sentinel.discover_master(ha.MASTER_NAME)) != old_master and m,
                          timeout=10, what="Sentinel naming a new master")
        acked_before = [n for n, _, answered in writer.acked if answered < killed_at]
        # The old master comes back (redis-up again) as a replica of the new one.
        redis_set.heal()
        poll(lambda: any(answered > time.monotonic() - 1 for _, _, answered in writer.acked[-5:]), timeout=20,
             what="writes acknowledged by a replica again")
    finally:
        writer.stop.set()
        thread.join(timeout=10)
    client = redis.Redis(host=new_master[0], port=new_master[1], socket_timeout=2)
    with contextlib.closing(client):
        values = client.mget([f"k{n}" for n in acked_before])
        assert client.info("replication")["role"] == "master"
    assert [n for n, value in zip(acked_before, values, strict=True) if value is None] == []
    old = redis.Redis(host=old_master[0], port=old_master[1], socket_timeout=2)
    with contextlib.closing(old):
        assert old.info("replication")["role"] == "slave"
