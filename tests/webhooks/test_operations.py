"""The outbox's history backfill, metrics, the task, its schedule and its process."""

from datetime import timedelta
from importlib import import_module

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from devtools.processes import procfile
from payments.execution import execute_batch
from tests.factories import claimed, due_payment, funded_account
from tests.ops.scrape import scrape
from webhooks import tasks
from webhooks.dispatcher import fan_out
from webhooks.metrics import WebhookCollector
from webhooks.models import Delivery, Endpoint, Event


@pytest.mark.django_db
def test_the_backfill_gives_history_its_events_already_fanned_out():
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1) for _ in range(3)]
    execute_batch(pairs=claimed(*payments))
    Event.objects.all().delete()  # as before the migration
    Endpoint.objects.create(owner=a.owner, url="https://example.com/hook", events=["payment.executed"])
    migration = import_module("webhooks.migrations.0002_outbox_triggers")
    with connection.cursor() as cur:
        cur.execute(migration.BACKFILL)
        cur.execute(migration.BACKFILL)  # idempotent
    events = Event.objects.filter(payment_id__in=[p.id for p in payments])
    assert events.count() == 3
    assert all(e.fanned_out_at is not None and e.type == "payment.executed" for e in events)
    assert all(e.snapshot["status"] == "EXECUTED" for e in events)
    assert fan_out() == (0, 0)  # no delivery for history
    assert not Delivery.objects.exists()


def gauges() -> dict[str, float]:
    return {family.name: family.samples[0].value for family in WebhookCollector().collect()}


@pytest.mark.django_db
def test_backlog_and_oldest_due_age(settings):
    assert gauges() == {
        "delaypay_webhook_outbox_backlog": 0,
        "delaypay_webhook_oldest_undelivered_age_seconds": 0,
    }
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1) for _ in range(2)]
    Endpoint.objects.create(owner=a.owner, url="https://example.com/hook", events=["payment.executed"])
    execute_batch(pairs=claimed(*payments))
    Event.objects.update(created_at=Now() - timedelta(seconds=400))
    readings = gauges()
    assert readings["delaypay_webhook_outbox_backlog"] == 2
    assert 399 <= readings["delaypay_webhook_oldest_undelivered_age_seconds"] < 500
    fan_out()
    Delivery.objects.update(next_attempt_at=Now() + timedelta(hours=1))  # waiting on the ladder: not late
    assert gauges() == {
        "delaypay_webhook_outbox_backlog": 2,
        "delaypay_webhook_oldest_undelivered_age_seconds": 0,
    }


@pytest.mark.django_db
def test_metrics_endpoint_serves_the_webhook_gauges():
    exported = scrape()
    assert exported["delaypay_webhook_outbox_backlog{}"] == 0
    assert exported["delaypay_webhook_oldest_undelivered_age_seconds{}"] == 0


@pytest.mark.django_db
def test_the_task_dispatches(settings):
    settings.DELAYPAY_WEBHOOK_BUDGET_SECONDS = 0
    assert tasks.dispatch() == {"fanned_out": 0, "claimed": 0, "succeeded": 0, "retrying": 0, "failed": 0}


def test_beat_sends_dispatch_every_tick_to_the_webhooks_queue():
    entry = settings.CELERY_BEAT_SCHEDULE["webhooks-dispatch"]
    assert entry["task"] == "webhooks.tasks.dispatch"
    assert entry["options"]["queue"] == "webhooks"
    assert settings.CELERY_TASK_ROUTES["webhooks.tasks.dispatch"] == {"queue": "webhooks"}
    line = procfile()["webhooks"]
    assert "-Q webhooks" in line and "-P threads" in line
