"""Deny by default: every endpoint x (anonymous, other user, owner, staff).

The world: ``owner`` owns account A (funded) and created payment P and recurring payment
R from it; ``other`` is an unrelated user with an account of their own; ``staff`` is a
staff user without any permission. Others' accounts, payments, recurring payments and
transfers are 404, never 403: existence is not revealed. ``is_staff`` alone grants
nothing: this staff user is an ordinary user (common/authz.py); staff read others' objects
with the model's view permission and act on them with the act's permission (below, and
every role and route in tests/test_permission_matrix.py).
"""

import copy
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction

from api import urls as api_urls
from payments.models import PaymentStatus, RecurringPayment, RecurringStatus, ScheduledPayment
from payouts.payees import payee_create
from tests.api import assert_error, future, patch, post
from tests.conftest import client_for, ensure_system_rows
from tests.factories import PASSWORD, UserFactory, funded_account
from webhooks.endpoints import endpoint_create
from webhooks.models import Delivery, DeliveryStatus, Event

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "other", "owner", "staff")


@dataclass
class World:
    users: dict
    account: object  # A, the owner's
    target: object  # where P pays to (the other user's account)
    payment: object  # P, scheduled from A by the owner
    recurring: object  # R, a daily recurring payment from A by the owner
    endpoint: object  # E, the owner's webhook endpoint
    delivery: object  # D, a failed delivery to E
    payee: object  # Y, the owner's payee

    def client(self, role):
        return client_for(self.users[role])


@pytest.fixture(scope="module")
def shared_world(django_db_setup, django_db_blocker):
    """The world, built once for the module (as Django's setUpTestData): inside a
    transaction rolled back after the module's last test. Each test runs in a savepoint of
    it and gets its own copy of the objects, so what one test changes the next never sees."""
    ensure_system_rows(django_db_blocker)
    with django_db_blocker.unblock(), transaction.atomic():
        yield build_world()
        transaction.set_rollback(True)


@pytest.fixture
def world(shared_world) -> World:
    return copy.deepcopy(shared_world)


def build_world() -> World:
    owner, other, staff = UserFactory(), UserFactory(), UserFactory(is_staff=True)
    account, target = funded_account(owner=owner, balance=100), funded_account(owner=other)
    payment = client_for(owner).post(
        "/api/v1/payments",
        {"from_account": account.id, "to_account": target.id, "amount": 5, "execute_at": future()},
        format="json",
        HTTP_IDEMPOTENCY_KEY="world",
    )
    assert payment.status_code == 201
    recurring = post(client_for(owner), "/api/v1/recurring-payments", recurring_body(account, target), key="world-r")
    assert recurring.status_code == 201, recurring.content
    endpoint = endpoint_create(owner=owner, url="https://hooks.example.com/owner", events=["payment.failed"]).endpoint
    event = Event.objects.create(type="payment.failed", owner=owner, payment_id="pay_x", version=1, snapshot={})
    return World(
        endpoint=endpoint,
        delivery=Delivery.objects.create(event=event, endpoint=endpoint, status=DeliveryStatus.FAILED),
        payee=payee_create(owner=owner, name="Bob", rail="sandbox", destination="acct_bob"),
        users={"anonymous": None, "other": other, "owner": owner, "staff": staff},
        account=account,
        target=target,
        payment=ScheduledPayment.objects.get(pk=payment.json()["payment_id"]),
        recurring=RecurringPayment.objects.get(pk=recurring.json()["recurring_id"]),
    )


def recurring_body(source, target) -> dict:
    return {"from_account": source.id, "to_account": target.id, "amount": 2, "start_at": future(), "interval": "P1D"}


def _request(world: World, role: str, endpoint: str):
    client, a, p, r = world.client(role), world.account.id, world.payment.id, world.recurring.id
    e = world.endpoint.id
    payment = {"from_account": a, "to_account": world.target.id, "amount": 1, "execute_at": future()}
    recurring = recurring_body(world.account, world.target)
    calls = {
        "POST /auth/token": lambda: post(client, "/api/v1/auth/token",
                                         {"username": world.users["owner"].username, "password": PASSWORD}),
        "POST /auth/logout": lambda: client.post("/api/v1/auth/logout"),
        "POST /auth/logout-all": lambda: client.post("/api/v1/auth/logout-all"),
        "GET /accounts": lambda: client.get("/api/v1/accounts"),
        "POST /accounts": lambda: post(client, "/api/v1/accounts", {"name": "new"}),
        "GET /accounts/{id}": lambda: client.get(f"/api/v1/accounts/{a}"),
        "POST /accounts/{id}/deposits": lambda: post(client, f"/api/v1/accounts/{a}/deposits",
                                                     {"amount": 1, "reason": "r"}, key="d"),
        "GET /deposit-requests": lambda: client.get("/api/v1/deposit-requests"),
        "GET /deposit-requests/{id}": lambda: client.get("/api/v1/deposit-requests/dreq_x"),
        "POST /deposit-requests/{id}/approve": lambda: post(client, "/api/v1/deposit-requests/dreq_x/approve",
                                                            {"reason": "r"}),
        "POST /deposit-requests/{id}/reject": lambda: post(client, "/api/v1/deposit-requests/dreq_x/reject",
                                                           {"reason": "r"}),
        "GET /accounts/{id}/payments": lambda: client.get(f"/api/v1/accounts/{a}/payments"),
        "GET /accounts/{id}/transfers": lambda: client.get(f"/api/v1/accounts/{a}/transfers"),
        "GET /payees": lambda: client.get("/api/v1/payees"),
        "POST /payees": lambda: post(client, "/api/v1/payees", {"name": "n", "rail": "sandbox", "destination": "x"},
                                     key="y"),
        "GET /payees/{id}": lambda: client.get(f"/api/v1/payees/{world.payee.id}"),
        "DELETE /payees/{id}": lambda: client.delete(f"/api/v1/payees/{world.payee.id}"),
        "GET /payments": lambda: client.get("/api/v1/payments"),
        "POST /payments": lambda: post(client, "/api/v1/payments", payment, key="p"),
        "GET /payments/{id}": lambda: client.get(f"/api/v1/payments/{p}"),
        "PATCH /payments/{id}": lambda: patch(client, f"/api/v1/payments/{p}", {"amount": 6}),
        "DELETE /payments/{id}": lambda: client.delete(f"/api/v1/payments/{p}"),
        "POST /payments/{id}/redrive": lambda: post(client, f"/api/v1/payments/{p}/redrive", {"reason": "r"}),
        "POST /payments/{id}/resolve": lambda: post(client, f"/api/v1/payments/{p}/resolve",
                                                    {"outcome": "failed", "reason": "r"}),
        "GET /recurring-payments": lambda: client.get("/api/v1/recurring-payments"),
        "POST /recurring-payments": lambda: post(client, "/api/v1/recurring-payments", recurring, key="r"),
        "GET /recurring-payments/{id}": lambda: client.get(f"/api/v1/recurring-payments/{r}"),
        "PATCH /recurring-payments/{id}": lambda: patch(client, f"/api/v1/recurring-payments/{r}", {"amount": 3}),
        "DELETE /recurring-payments/{id}": lambda: client.delete(f"/api/v1/recurring-payments/{r}"),
        "POST /recurring-payments/{id}/pause": lambda: client.post(f"/api/v1/recurring-payments/{r}/pause"),
        "POST /recurring-payments/{id}/resume": lambda: client.post(f"/api/v1/recurring-payments/{r}/resume"),
        "GET /webhook-endpoints": lambda: client.get("/api/v1/webhook-endpoints"),
        "POST /webhook-endpoints": lambda: post(client, "/api/v1/webhook-endpoints",
                                                {"url": "https://hooks.example.com/x", "events": ["payment.failed"]},
                                                key="w"),
        "GET /webhook-endpoints/{id}": lambda: client.get(f"/api/v1/webhook-endpoints/{e}"),
        "PATCH /webhook-endpoints/{id}": lambda: patch(client, f"/api/v1/webhook-endpoints/{e}", {"enabled": False}),
        "DELETE /webhook-endpoints/{id}": lambda: client.delete(f"/api/v1/webhook-endpoints/{e}"),
        "POST /webhook-endpoints/{id}/rotate-secret": lambda: post(
            client, f"/api/v1/webhook-endpoints/{e}/rotate-secret", None, key="rot"),
        "GET /webhook-endpoints/{id}/deliveries": lambda: client.get(f"/api/v1/webhook-endpoints/{e}/deliveries"),
        "POST /webhook-endpoints/{id}/deliveries/{id}/resend": lambda: client.post(
            f"/api/v1/webhook-endpoints/{e}/deliveries/{world.delivery.pk}/resend"),
        "GET /schema": lambda: client.get("/api/v1/schema"),
        "GET /docs": lambda: client.get("/api/v1/docs"),
    }
    return calls[endpoint]()


#                                   anonymous  other  owner  staff
MATRIX = {
    "POST /auth/token":               (200,      200,   200,   200),
    "POST /auth/logout":              (401,      204,   204,   204),  # revokes the caller's own token
    "POST /auth/logout-all":          (401,      204,   204,   204),  # revokes the caller's own tokens
    "GET /accounts":                  (401,      200,   200,   200),
    "POST /accounts":                 (401,      201,   201,   201),
    "GET /accounts/{id}":             (401,      404,   200,   404),  # staff: ledger.view_account
    "POST /accounts/{id}/deposits":   (401,      403,   403,   403),  # staff: ledger.deposit_account
    "GET /deposit-requests":          (401,      403,   403,   403),  # staff: ledger.view_depositrequest
    "GET /deposit-requests/{id}":     (401,      403,   403,   403),  # staff: ledger.view_depositrequest
    "POST /deposit-requests/{id}/approve": (401, 403,   403,   403),  # staff: ledger.approve_deposit
    "POST /deposit-requests/{id}/reject":  (401, 403,   403,   403),  # staff: ledger.approve_deposit
    "GET /accounts/{id}/payments":    (401,      404,   200,   404),  # staff: ledger.view_account
    "GET /accounts/{id}/transfers":   (401,      404,   200,   404),  # staff: ledger.view_account
    "GET /payees":                    (401,      200,   200,   200),
    "POST /payees":                   (401,      201,   201,   201),
    "GET /payees/{id}":               (401,      404,   200,   404),  # staff: payments.view_payee
    "DELETE /payees/{id}":            (401,      404,   204,   404),  # the owner's alone
    "GET /payments":                  (401,      200,   200,   200),
    "POST /payments":                 (401,      400,   201,   400),  # 400: from_account is not theirs
    "GET /payments/{id}":             (401,      404,   200,   404),  # staff: payments.view_scheduledpayment
    "PATCH /payments/{id}":           (401,      404,   200,   404),  # staff: that and ...change_scheduledpayment
    "DELETE /payments/{id}":          (401,      404,   200,   404),  # staff: that and ...cancel_scheduledpayment
    "POST /payments/{id}/redrive":    (401,      404,   403,   404),  # staff: that and ...redrive_scheduledpayment
    "POST /payments/{id}/resolve":    (401,      404,   403,   404),  # the creator may not: a staff act
    "GET /recurring-payments":        (401,      200,   200,   200),
    "POST /recurring-payments":       (401,      400,   201,   400),  # 400: from_account is not theirs
    "GET /recurring-payments/{id}":   (401,      404,   200,   404),  # staff: payments.view_recurringpayment
    "PATCH /recurring-payments/{id}": (401,      404,   200,   404),  # staff: that and ...change_recurringpayment
    "DELETE /recurring-payments/{id}": (401,     404,   200,   404),  # staff: that and ...delete_recurringpayment
    "POST /recurring-payments/{id}/pause":  (401, 404,  200,   404),  # staff: that and ...pause_recurringpayment
    "POST /recurring-payments/{id}/resume": (401, 404,  200,   404),  # staff: that and ...pause_recurringpayment
    "GET /webhook-endpoints":         (401,      200,   200,   200),
    "POST /webhook-endpoints":        (401,      201,   201,   201),
    "GET /webhook-endpoints/{id}":    (401,      404,   200,   404),  # staff: webhooks.view_endpoint
    "PATCH /webhook-endpoints/{id}":  (401,      404,   200,   404),  # the owner's alone
    "DELETE /webhook-endpoints/{id}": (401,      404,   204,   404),
    "POST /webhook-endpoints/{id}/rotate-secret": (401, 404, 200, 404),
    "GET /webhook-endpoints/{id}/deliveries":     (401, 404, 200, 404),  # staff: ...view_endpoint, ...view_delivery
    "POST /webhook-endpoints/{id}/deliveries/{id}/resend": (401, 404, 202, 404),
    "GET /schema":                    (200,      200,   200,   200),
    "GET /docs":                      (200,      200,   200,   200),
}  # fmt: skip

ERROR_CODES = {401: "not_authenticated", 403: "permission_denied", 404: "not_found", 400: "validation_error"}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("endpoint", list(MATRIX))
def test_authorization_matrix(world, endpoint, role):
    expected = MATRIX[endpoint][ROLES.index(role)]
    response = _request(world, role, endpoint)
    assert response.status_code == expected, (endpoint, role, response.content[:300])
    if expected >= 400:
        body = assert_error(response, expected, ERROR_CODES[expected])
        if expected == 400:
            assert "from_account" in body["fields"]
    if expected == 401:
        assert response["WWW-Authenticate"].startswith("Token")


def test_the_matrix_covers_every_route():
    assert len(api_urls.urlpatterns) == len({e.split(" ", 1)[1] for e in MATRIX})


def test_a_rejected_request_changes_nothing(world):
    for role in ("anonymous", "other", "staff"):
        for endpoint in MATRIX:
            # Every write on P or R, and the creates from A (staff may deposit: not tried here).
            if endpoint.startswith(("PATCH", "DELETE", "POST /payments", "POST /recurring")):
                _request(world, role, endpoint)
    _request(world, "owner", "POST /accounts/{id}/deposits")
    world.payment.refresh_from_db()
    world.account.refresh_from_db()
    world.recurring.refresh_from_db()
    assert (world.payment.status, world.payment.amount, world.payment.version) == (PaymentStatus.SCHEDULED, 5, 1)
    assert (world.recurring.status, world.recurring.amount, world.recurring.version) == (RecurringStatus.ACTIVE, 2, 1)
    assert ScheduledPayment.objects.count() == 2  # P and R's first occurrence
    assert RecurringPayment.objects.count() == 1
    assert world.account.balance == 100


LISTS = [
    "GET /accounts",
    "GET /payments",
    "GET /accounts/{id}/payments",
    "GET /accounts/{id}/transfers",
    "GET /recurring-payments",
]


@pytest.mark.parametrize("role", ["other", "owner", "staff"])
@pytest.mark.parametrize("endpoint", LISTS)
def test_lists_show_only_what_the_caller_may_see(world, endpoint, role):
    response = _request(world, role, endpoint)
    if response.status_code == 404:
        return  # covered by the matrix: the whole list is hidden
    ids = {next(v for k, v in item.items() if k.endswith("_id")) for item in response.json()["items"]}
    sees_owners_things = role == "owner"  # staff without a view permission see their own rows only
    if endpoint == "GET /accounts":
        assert (world.account.id in ids) == sees_owners_things
        if role == "other":
            assert ids == {world.target.id}
    elif endpoint == "GET /accounts/{id}/transfers":
        assert len(ids) == 1  # the deposit that funded A
    elif endpoint == "GET /recurring-payments":
        assert (world.recurring.id in ids) == sees_owners_things
    else:
        assert (world.payment.id in ids) == sees_owners_things


def test_the_receiver_of_a_payment_cannot_read_or_cancel_it(world):
    receiver = world.client("other")
    assert_error(receiver.get(f"/api/v1/payments/{world.payment.id}"), 404, "not_found")
    assert_error(receiver.delete(f"/api/v1/payments/{world.payment.id}"), 404, "not_found")
    assert receiver.get(f"/api/v1/accounts/{world.target.id}/payments").json()["items"] == []


def test_staff_with_the_view_and_cancel_permissions_may_cancel_any_payment(world):
    staff = world.users["staff"]
    url = f"/api/v1/payments/{world.payment.id}"
    # An act's permission reaches nothing its holder may not read: still a stranger's payment.
    assert_error(_grant(staff, "cancel_scheduledpayment").delete(f"{url}?reason=r"), 404, "not_found")
    client = _grant(staff, "view_scheduledpayment")
    assert_error(client.delete(url), 400, "validation_error")  # a staff cancel says why
    response = client.delete(f"{url}?reason=customer+called")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"


def test_a_superuser_may_cancel_any_payment(world):
    root = UserFactory(is_staff=True, is_superuser=True)
    response = client_for(root).delete(f"/api/v1/payments/{world.payment.id}?reason=fraud")
    assert response.json()["status"] == "CANCELLED"


def test_the_owner_of_the_debited_account_may_cancel_a_payment_someone_else_created(world):
    # Payments are created only by owners today; visibility also covers an account that
    # changed hands, so pin the rule: the from_account's owner may cancel.
    new_owner = UserFactory()
    type(world.account).objects.filter(pk=world.account.pk).update(owner=new_owner)
    assert client_for(new_owner).delete(f"/api/v1/payments/{world.payment.id}").json()["status"] == "CANCELLED"


@pytest.mark.parametrize(
    "header", ["Token nope", "Token " + "0" * 40, "Token a\x00b", "Bearer x", "Token", "Token a b"]
)
def test_invalid_tokens_are_401(world, header):
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_error(client.get("/api/v1/accounts"), 401, "not_authenticated")


def test_an_inactive_users_token_is_401(world):
    client = world.client("owner")
    type(world.users["owner"]).objects.filter(pk=world.users["owner"].pk).update(is_active=False)
    assert_error(client.get("/api/v1/accounts"), 401, "not_authenticated")


def _grant(user, *codenames):
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return client_for(type(user).objects.get(pk=user.pk))  # a fresh user: no cached permissions


def test_staff_may_change_others_payments_only_with_the_change_permission(world):
    staff = world.users["staff"]
    _grant(staff, "view_scheduledpayment", "cancel_scheduledpayment")  # cancelling is not changing
    url = f"/api/v1/payments/{world.payment.id}"
    assert_error(patch(client_for(staff), url, {"amount": 6}), 403, "permission_denied")
    response = patch(_grant(staff, "change_scheduledpayment"), url, {"amount": 6})
    assert response.status_code == 200 and response.json()["amount"] == 6


def test_staff_with_the_pause_permission_may_pause_and_resume_but_not_end_or_change(world):
    client = _grant(world.users["staff"], "view_recurringpayment", "pause_recurringpayment")
    url = f"/api/v1/recurring-payments/{world.recurring.id}"
    assert client.post(f"{url}/pause").json()["status"] == "PAUSED"
    assert client.post(f"{url}/resume").json()["status"] == "ACTIVE"
    assert_error(client.delete(url), 403, "permission_denied")
    assert_error(patch(client, url, {"amount": 3}), 403, "permission_denied")
    assert client.get(url).json()["status"] == "ACTIVE"


def test_a_superuser_may_change_end_and_pause_any_recurring_payment(world):
    root = client_for(UserFactory(is_staff=True, is_superuser=True))
    url = f"/api/v1/recurring-payments/{world.recurring.id}"
    assert patch(root, url, {"amount": 7}).json()["amount"] == 7
    assert root.post(f"{url}/pause").json()["status"] == "PAUSED"
    assert root.delete(url).json()["status"] == "ENDED"
    assert patch(root, f"/api/v1/payments/{world.payment.id}", {"amount": 8}).json()["amount"] == 8


def test_the_receiver_of_a_recurring_payment_cannot_see_or_touch_it(world):
    receiver = world.client("other")
    url = f"/api/v1/recurring-payments/{world.recurring.id}"
    for response in (receiver.get(url), receiver.post(f"{url}/pause"), patch(receiver, url, {"amount": 1})):
        assert_error(response, 404, "not_found")
    assert receiver.get("/api/v1/recurring-payments").json()["items"] == []


@pytest.mark.parametrize(("group", "status"), [("support", 403), ("auditor", 403), (None, 201)])
def test_only_staff_with_the_deposit_permission_create_money(group, status):
    """Neither shipped group may mint money through the API; only the permission the
    admin's deposit form also asks for does."""
    from django.contrib.auth.models import Group, Permission
    from django.core.management import call_command

    call_command("staff_groups", verbosity=0)
    staff = UserFactory(is_staff=True)
    if group:
        staff.groups.add(Group.objects.get(name=group))
    else:
        # Depositing, and reading the account it goes into (someone else's).
        wanted = ["deposit_account", "view_account"]
        staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="ledger", codename__in=wanted))
    account = funded_account()
    response = client_for(staff).post(
        f"/api/v1/accounts/{account.id}/deposits", {"amount": 1_000, "reason": "top-up"}, format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert response.status_code == status, response.content
    account.refresh_from_db()
    assert account.balance == (1_000 if status == 201 else 0)
