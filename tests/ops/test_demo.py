"""`manage.py demo`, as `make run` calls it: idempotent people and setup, fresh payments."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import DepositRequest
from payments.models import Payee, ScheduledPayment
from webhooks.models import Endpoint

pytestmark = pytest.mark.django_db


def test_demo_twice_sets_up_once_and_schedules_each_time(settings, staff_groups, tmp_path):
    settings.DEBUG = True  # as make run
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    secrets = tmp_path / "secrets"
    for _ in range(2):
        call_command("demo", webhook_url="http://127.0.0.1:8099/", webhook_secret_file=str(secrets), stdout=None)
    endpoint = Endpoint.objects.get()
    assert endpoint.owner.username == "alice" and endpoint.enabled
    assert secrets.read_text().split() == [endpoint.secret]  # appended once
    request = DepositRequest.objects.get()  # four eyes: one request waits for approval
    assert request.status == "pending" and request.requested_by.username == "treasurer"
    assert request.requested_by.groups.filter(name="treasury").exists()
    # nine a run: five due, one underfunded, one cancelled, and two payouts (one to a declining payee)
    assert ScheduledPayment.objects.count() == 18
    assert Payee.objects.count() == 2  # the payees are made once


def test_demo_refuses_production_settings(settings, staff_groups):
    """A superuser with a known password and money from nowhere: never with DJANGO_DEBUG=0."""
    settings.DEBUG = False
    with pytest.raises(CommandError, match="DJANGO_DEBUG=1"):
        call_command("demo", stdout=None)
    assert not get_user_model().objects.exists() and not ScheduledPayment.objects.exists()
