"""The read replica against a real streaming standby (tests/replica/conftest.py).

Which database served a read is shown by what the read sees: with the standby's replay
paused, a row changed on the primary is new there and old on the replica. The counter
delaypay_api_reads_total (from /metrics) says why.
"""

import math
import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from delaypay.db_router import PRIMARY, REPLICA, PrimaryReplicaRouter, ReplicaMonitor
from payments.models import ScheduledPayment

from .conftest import poll

# One xdist worker for the module: its pair of PostgreSQL clusters is session-scoped, and
# every worker that ran one of these tests would initdb and seed a pair of its own.
pytestmark = pytest.mark.xdist_group("replica")


def set_amount(pair, payment_id: str, amount: int) -> None:
    """A write on the primary that is not the API's (nobody's read-your-writes window opens)."""
    pair.primary.execute(
        "UPDATE payments_scheduledpayment SET amount = %s, version = version + 1 WHERE id = %s", [amount, payment_id]
    )


def amount_read(web, payment_id: str, token: str) -> int:
    response = web.get(f"payments/{payment_id}", token)
    assert response.status_code == 200, response.text
    return response.json()["amount"]


def listed_amounts(web, token: str) -> dict[str, int]:
    response = web.get("payments", token)
    assert response.status_code == 200, response.text
    return {item["payment_id"]: item["amount"] for item in response.json()["items"]}


def grew(before: dict, after: dict, key: tuple[str, str]) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_a_reader_who_has_not_written_is_served_by_the_replica(pair, start_web):
    web = start_web(DELAYPAY_REPLICA_MAX_LAG_SECONDS="60", DELAYPAY_REPLICA_CHECK_SECONDS="0.2")
    bob = pair.seed["bob"]
    set_amount(pair, bob["payment"], 100)
    pair.wait_caught_up()
    assert listed_amounts(web, bob["token"])[bob["payment"]] == 100
    before = web.reads()

    pair.pause_replay()
    set_amount(pair, bob["payment"], 101)
    # The primary has 101; the API still answers 100: the replica served these reads.
    assert listed_amounts(web, bob["token"])[bob["payment"]] == 100
    assert amount_read(web, bob["payment"], bob["token"]) == 100
    assert grew(before, web.reads(), ("replica", "replica_ok")) == 2

    pair.resume_replay()
    poll(lambda: amount_read(web, bob["payment"], bob["token"]) == 101, what="the replica to replay the change")
    assert listed_amounts(web, bob["token"])[bob["payment"]] == 101


def test_a_client_that_just_wrote_reads_its_write_from_the_primary(pair, start_web):
    web = start_web(
        DELAYPAY_REPLICA_MAX_LAG_SECONDS="60",
        DELAYPAY_REPLICA_CHECK_SECONDS="0.2",
        DELAYPAY_READ_YOUR_WRITES_SECONDS="4",
    )
    alice, bob, carol = pair.seed["alice"], pair.seed["bob"], pair.seed["carol"]
    before = web.reads()
    pair.pause_replay()
    execute_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    created = web.post(
        "payments", alice["token"],
        {"from_account": alice["account"], "to_account": bob["account"], "amount": 7, "execute_at": execute_at},
        key=str(uuid.uuid4()),
    )
    assert created.status_code == 201, created.text
    payment_id = created.json()["payment_id"]

    # The replica cannot have it (replay is paused), yet the writer sees it at once.
    assert amount_read(web, payment_id, alice["token"]) == 7
    assert payment_id in listed_amounts(web, alice["token"])
    assert grew(before, web.reads(), ("primary", "recent_write")) == 2
    # Someone who has not written (staff who may read every payment) reads the replica.
    assert web.get(f"payments/{payment_id}", carol["token"]).status_code == 404
    assert not pair.replica.execute("SELECT 1 FROM payments_scheduledpayment WHERE id = %s", [payment_id])

    # Once the window has passed the writer reads the replica again (still paused: not there).
    poll(
        lambda: web.get(f"payments/{payment_id}", alice["token"]).status_code == 404,
        timeout=20, what="the read-your-writes window to end",
    )
    pair.resume_replay()
    poll(lambda: web.get(f"payments/{payment_id}", carol["token"]).status_code == 200, what="the replica to replay")


def test_reads_answer_from_the_primary_when_the_replica_stops(pair, start_web):
    # A health answer kept for a minute: the failing read itself finds the replica gone.
    web = start_web(DELAYPAY_REPLICA_MAX_LAG_SECONDS="60", DELAYPAY_REPLICA_CHECK_SECONDS="60")
    bob = pair.seed["bob"]
    set_amount(pair, bob["payment"], 102)
    pair.wait_caught_up()
    assert amount_read(web, bob["payment"], bob["token"]) == 102
    before = web.reads()
    assert grew({}, before, ("replica", "replica_ok")) == 1

    pair.replica.stop()
    set_amount(pair, bob["payment"], 103)
    for _ in range(3):
        assert amount_read(web, bob["payment"], bob["token"]) == 103
    assert listed_amounts(web, bob["token"])[bob["payment"]] == 103
    after = web.reads()
    assert grew(before, after, ("primary", "replica_error")) == 1  # the first read, answered again
    assert grew(before, after, ("primary", "replica_down")) == 3  # then the primary until the next check
    assert "a read on the replica failed" in web.log()


def test_an_idle_primary_is_no_lag_but_a_paused_replay_is(pair, start_web):
    web = start_web(DELAYPAY_REPLICA_MAX_LAG_SECONDS="1", DELAYPAY_REPLICA_CHECK_SECONDS="0.2")
    dave = pair.seed["dave"]
    set_amount(pair, dave["payment"], 100)
    pair.wait_caught_up()
    # Nothing committed for longer than the threshold: now() - pg_last_xact_replay_timestamp()
    # is above it, yet the replica has everything and keeps serving.
    poll(
        lambda: pair.replica.execute("SELECT now() - pg_last_xact_replay_timestamp() > interval '1.5 s'")[0][0],
        timeout=20, what="the last replayed commit to be older than the threshold",
    )
    before = web.reads()
    assert amount_read(web, dave["payment"], dave["token"]) == 100
    assert grew(before, web.reads(), ("replica", "replica_ok")) == 1

    pair.pause_replay()
    set_amount(pair, dave["payment"], 104)
    # Replay stays paused: once the lag passes a second, reads see the primary's 104.
    poll(lambda: amount_read(web, dave["payment"], dave["token"]) == 104, what="reads to move to the primary")
    assert pair.replay_paused()
    assert pair.replica.execute("SELECT amount FROM payments_scheduledpayment WHERE id = %s", [dave["payment"]]) == [
        (100,)
    ]
    assert web.reads().get(("primary", "replica_lagging"), 0) >= 1
    lag = [line for line in web.client.get("/metrics").text.splitlines() if line.startswith("delaypay_replica_lag")]
    assert lag and float(lag[0].split()[-1]) > 1


# --- Without a cluster --------------------------------------------------------------------


@pytest.mark.skipif(bool(os.environ.get("DATABASE_REPLICA_URL")), reason="a replica is configured for this run")
def test_without_a_replica_url_nothing_changes():
    assert not settings.DATABASE_REPLICA_URL
    assert set(settings.DATABASES) == {"default"}
    assert settings.DATABASE_ROUTERS == []
    assert "delaypay.read_routing.ReadReplicaMiddleware" not in settings.MIDDLEWARE


def test_the_router_writes_and_migrates_only_the_primary():
    router = PrimaryReplicaRouter()
    assert router.db_for_write(ScheduledPayment) == PRIMARY
    assert router.db_for_read(ScheduledPayment) == PRIMARY  # outside an API read request
    assert router.allow_migrate(PRIMARY, "payments")
    assert not router.allow_migrate(REPLICA, "payments")


def test_lag_compares_positions_before_clocks():
    now = time.monotonic()
    monitor = ReplicaMonitor(max_lag=2, interval=1)
    # Caught up: no lag, however old the last replayed commit.
    assert monitor._lag(now - 1, primary_position=500, replay_position=500, replay_age=3600.0) == 0.0
    # Behind a position sampled a second ago that it had reached: about a second, even after
    # a long idle spell (its last replayed commit is an hour old).
    assert 1 <= monitor._lag(now, primary_position=600, replay_position=500, replay_age=3600.0) < 60
    # A fresh process that finds the replica behind: the age of its last replayed commit.
    fresh = ReplicaMonitor(max_lag=2, interval=1)
    assert fresh._lag(now, primary_position=600, replay_position=500, replay_age=7.5) == 7.5
    assert math.isinf(ReplicaMonitor(max_lag=2, interval=1)._lag(now, 600, 500, None))
