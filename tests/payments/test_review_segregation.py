"""Segregation of duties for the review queue (issue 33): staff who created a payment, or
own an account it pays from or to, may not re-drive or resolve it, whatever permissions
they hold (403 conflict_of_interest in the API, refused in the admin); someone else may."""

import pytest
from django.urls import reverse

from common.admin_tools import id_in_url
from common.authz import ConflictOfInterest
from payments.models import PaymentStatus, ScheduledPayment
from payments.services import payment_redrive, payment_resolve
from tests.api import assert_error, post
from tests.conftest import admin_client_for, client_for, staff_in
from tests.factories import AccountFactory, funded_account, parked_payment

pytestmark = pytest.mark.django_db


def redrive(user, payment):
    return post(client_for(user), f"/api/v1/payments/{payment.id}/redrive", {"reason": "worker bug fixed"})


def resolve(user, payment):
    return post(client_for(user), f"/api/v1/payments/{payment.id}/resolve", {"outcome": "failed", "reason": "gone"})


def status(payment) -> str:
    return ScheduledPayment.objects.get(pk=payment.pk).status


@pytest.fixture
def support(staff_groups):
    return staff_in("support")


@pytest.mark.parametrize("party", ["payer", "recipient"])
@pytest.mark.parametrize("act", [redrive, resolve], ids=["redrive", "resolve"])
def test_a_party_to_the_payment_may_not_review_it_through_the_api(settings, support, party, act):
    """The finding: a support member who created a payment re-drove it themselves (200)."""
    source = funded_account(owner=support if party == "payer" else None, balance=10)
    target = AccountFactory(owner=support) if party == "recipient" else funded_account()
    parked = parked_payment(settings, source=source, target=target)
    assert_error(act(support, parked), 403, "conflict_of_interest")
    assert status(parked) == PaymentStatus.NEEDS_REVIEW
    colleague = staff_in("support")
    assert act(colleague, parked).status_code == 200
    assert status(parked) != PaymentStatus.NEEDS_REVIEW


def test_the_services_refuse_the_payments_creator_whatever_they_hold(settings, staff_groups):
    from tests.factories import UserFactory

    superuser = UserFactory(is_staff=True, is_superuser=True)
    parked = parked_payment(settings, source=funded_account(owner=superuser, balance=10), target=funded_account())
    with pytest.raises(ConflictOfInterest):
        payment_redrive(payment_id=parked.pk, actor=superuser, reason="mine")
    with pytest.raises(ConflictOfInterest):
        payment_resolve(payment_id=parked.pk, actor=superuser, outcome="failed", reason="mine")
    assert status(parked) == PaymentStatus.NEEDS_REVIEW


@pytest.mark.parametrize("name", ["redrive", "resolve"])
def test_the_admin_refuses_a_party_to_the_payment(settings, support, name):
    parked = parked_payment(settings, source=funded_account(owner=support, balance=10), target=funded_account())
    client = admin_client_for(support)
    url = reverse(f"admin:payments_scheduledpayment_{name}", args=[id_in_url(parked.pk)])
    response = client.post(url, {"reason": "mine", "confirmed": "1"}, follow=True)
    messages = [str(m) for m in response.context["messages"]]
    assert any("you created it or are a party to it" in m for m in messages), messages
    assert status(parked) == PaymentStatus.NEEDS_REVIEW
