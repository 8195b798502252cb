from datetime import timedelta

import pytest
from django.utils import timezone

from payments.execution import execute_batch
from payments.models import ScheduledPayment
from payments.promoter import claim_due
from payments.selectors import (
    payment_counts_by_status,
    payments_due_by_minute,
    recent_outcomes,
    schedule_health,
)
from tests.factories import due_payment, expire_lease, funded_account

pytestmark = pytest.mark.django_db


def test_schedule_health_reports_oldest_due_age_and_leases():
    a, b = funded_account(balance=100), funded_account()
    assert schedule_health().oldest_due_age_seconds == 0
    due_payment(source=a, target=b, amount=1, seconds_ago=30)
    due_payment(source=a, target=b, amount=1, seconds_ago=5)
    health = schedule_health()
    assert 29 <= health.oldest_due_age_seconds < 60
    assert health.overdue == 2
    claim_due(batch=1, lease_seconds=60)
    stuck = ScheduledPayment.objects.get(status="EXECUTING")
    assert schedule_health().in_flight == 1
    expire_lease(stuck)
    health = schedule_health()
    assert (health.in_flight, health.leases_expired, health.overdue) == (0, 1, 1)


def test_counts_due_by_minute_and_recent_outcomes():
    a, b = funded_account(balance=10), funded_account()
    due_payment(source=a, target=b, amount=10)
    due_payment(source=a, target=b, amount=10)  # the second finds the account empty
    ScheduledPayment.objects.create(
        payer=a.owner, from_account=a, to_account=b, amount=1, execute_at=timezone.now() + timedelta(minutes=5)
    )
    execute_batch(pairs=claim_due(batch=10, lease_seconds=60).fresh)
    counts = payment_counts_by_status()
    assert counts == {"SCHEDULED": 1, "EXECUTING": 0, "EXECUTED": 1, "FAILED": 1, "CANCELLED": 0, "NEEDS_REVIEW": 0}
    minutes = payments_due_by_minute(minutes=60)
    assert len(minutes) == 60
    assert sum(n for _, n in minutes) == 1
    outcomes = recent_outcomes()
    assert outcomes.executed == 1
    assert outcomes.failed == {"insufficient_funds": 1}
