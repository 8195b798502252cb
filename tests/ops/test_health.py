"""GET /healthz and GET /readyz."""

import shutil
import socket
import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from delaypay import health
from payments.models import Heartbeat
from payments.services import heartbeat_record

from .scrape import scrape


def test_healthz_answers_without_touching_anything(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_is_200_when_everything_answers(client):
    heartbeat_record(name=Heartbeat.PROMOTER)
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True, "migrations": True, "redis": True, "promoter": True,
    }
    assert body["checks"]["promoter"]["last_tick_age_seconds"] < 10
    assert (body["checks"]["redis"]["degraded"], body["checks"]["redis"]["required"]) == (False, False)


@pytest.mark.django_db
def test_readyz_is_503_when_the_promoter_stopped_ticking(client, settings):
    heartbeat_record(name=Heartbeat.PROMOTER)
    Heartbeat.objects.filter(name=Heartbeat.PROMOTER).update(beat_at=timezone.now() - timedelta(seconds=60))
    response = client.get("/readyz")
    assert response.status_code == 503
    promoter = response.json()["checks"]["promoter"]
    assert promoter["ok"] is False
    assert promoter["last_tick_age_seconds"] >= 60

    # A deployment may keep web in service and leave the promoter to its alert.
    settings.DELAYPAY_READY_REQUIRE_PROMOTER = False
    response = client.get("/readyz")
    assert response.status_code == 200
    promoter = response.json()["checks"]["promoter"]
    assert (promoter["ok"], promoter["required"]) == (False, False)


@pytest.mark.django_db
def test_readyz_is_503_before_the_promoter_ever_ticked(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["promoter"]["error"] == "never_ticked"


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_pending(client, monkeypatch):
    heartbeat_record(name=Heartbeat.PROMOTER)
    monkeypatch.setattr(health, "_migrations_applied", False)
    latest = max(name for app, name in MigrationLoader(connection).graph.leaf_nodes() if app == "payments")
    with connection.cursor() as cur:  # rolled back with the test's transaction
        cur.execute("DELETE FROM django_migrations WHERE app = 'payments' AND name = %s", [latest])
    response = client.get("/readyz")
    assert response.status_code == 503
    migrations = response.json()["checks"]["migrations"]
    assert (migrations["ok"], migrations["pending"]) == (False, 1)
    monkeypatch.setattr(health, "_migrations_applied", False)


def test_readyz_refuses_writes_with_a_json_405(client):
    response = client.post("/readyz")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


@pytest.mark.django_db
def test_ops_endpoints_are_not_redirected_to_https(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    heartbeat_record(name=Heartbeat.PROMOTER)
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    assert client.get("/api/v1/payments").status_code == 301


class PrivateRedis:
    """A redis-server of our own on a free port, to stop and start at will (the shared
    Redis the other tests and helpers use is never touched)."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        subprocess.run(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "yes"],
            check=True, capture_output=True,
        )
        self._wait(up=True)

    def stop(self):
        try:
            redis.Redis(port=self.port, socket_timeout=2).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # shutdown closes the connection under us
        self._wait(up=False)

    def _wait(self, *, up: bool):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
                alive = True
            except redis.ConnectionError:
                alive = False
            if alive == up:
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis on port {self.port} did not come {'up' if up else 'down'}")


@pytest.fixture
def private_redis():
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.django_db
def test_readyz_stays_200_degraded_while_redis_is_down_and_ok_when_it_returns(client, settings, private_redis):
    """Accepting and reading payments needs PostgreSQL only; while Redis is down the
    promoter executes from the database (payments/fallback.py)."""
    settings.REDIS_URL = private_redis.url
    # The promoter's heartbeat is not what this test is about: stopping and starting a
    # Redis server on a loaded machine took longer than the 10 s default allows.
    settings.DELAYPAY_READY_MAX_TICK_AGE_SECONDS = 3600
    heartbeat_record(name=Heartbeat.PROMOTER)
    assert client.get("/readyz").json()["status"] == "ok"

    private_redis.stop()
    started = time.monotonic()
    response = client.get("/readyz")
    assert time.monotonic() - started < 2.0  # one quick PING, not redis-py's retries
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "degraded"
    redis_check = body["checks"]["redis"]
    assert (redis_check["ok"], redis_check["degraded"], redis_check["required"]) == (False, True, False)
    assert redis_check["error"] == "ConnectionError"
    assert body["checks"]["database"]["ok"] is True
    assert scrape()["delaypay_broker_up{}"] == 0

    private_redis.start()
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ok"
    assert response.json()["checks"]["redis"]["ok"] is True
    assert scrape()["delaypay_broker_up{}"] == 1


@pytest.mark.django_db
def test_readyz_is_503_not_degraded_when_the_database_is_unreachable(client, monkeypatch):
    def refused():
        raise OSError("connection refused")

    monkeypatch.setattr(health, "check_database", refused)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
