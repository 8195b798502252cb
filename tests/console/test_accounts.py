"""The console's second pass on the ledger side: an account's page links to its payments,
transfers and staff acts and carries Freeze/Unfreeze behind the confirmation page; a user's
page links to their accounts and payments; amounts have thousands separators; /favicon.ico
is served; a refused request logs one line without a traceback."""

import logging

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils.http import urlencode

from common.admin_tools import id_in_url
from common.formats import human
from delaypay.logs import ClientErrorWithoutTraceback, TickLinesAtDebug, logging_config
from ledger.models import Account, StaffAction
from tests.conftest import admin_client_for
from tests.factories import UserFactory, due_payment, funded_account

pytestmark = pytest.mark.django_db

ACCOUNTS = reverse("admin:ledger_account_changelist")
PAYMENTS = reverse("admin:payments_scheduledpayment_changelist")
STAFF_ACTIONS = reverse("admin:ledger_staffaction_changelist")
TRANSFERS = reverse("admin:ledger_transfer_changelist")


def account_url(account) -> str:
    return reverse("admin:ledger_account_change", args=[id_in_url(account.pk)])


def act_url(account, act: str) -> str:
    return reverse(f"admin:ledger_account_{act}", args=[id_in_url(account.pk)])


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def listed(response) -> set[str]:
    assert response.status_code == 200
    return {str(obj.pk) for obj in response.context["cl"].result_list}


def href(url: str) -> str:
    return f'href="{url.replace("&", "&amp;")}"'


# --- the account page's links ------------------------------------------------------------------


def test_account_page_links_to_its_payments_transfers_and_staff_acts(superuser):
    account, other = funded_account(balance=100), funded_account()
    third = funded_account(balance=100)
    out = due_payment(source=account, target=other, amount=1, seconds_ago=-600)
    incoming = due_payment(source=third, target=account, amount=1, seconds_ago=-600)
    unrelated = due_payment(source=third, target=other, amount=1, seconds_ago=-600)
    client = admin_client_for(superuser)
    html = client.get(account_url(account)).content.decode()
    payments = f"{PAYMENTS}?{urlencode({'account': account.pk})}"
    staff_acts = f"{STAFF_ACTIONS}?{urlencode({'account': account.pk})}"
    for url in (payments, staff_acts, f"{TRANSFERS}?{urlencode({'account': account.pk})}"):
        assert href(url) in html, url
    assert listed(client.get(payments)) == {out.pk, incoming.pk}
    assert unrelated.pk not in listed(client.get(payments))


def test_staff_acts_link_lists_only_that_accounts_acts(superuser):
    account, other = funded_account(), funded_account()
    client = admin_client_for(superuser)
    for target in (account, other):
        client.post(act_url(target, "freeze"), {"confirmed": "1", "reason": f"case {target.pk}"})
    assert StaffAction.objects.count() == 2
    response = client.get(STAFF_ACTIONS, {"account": account.pk})
    assert listed(response) == {str(StaffAction.objects.get(account=account).pk)}
    assert f"case {account.pk}" in response.content.decode()


# --- Freeze / Unfreeze from the account page -------------------------------------------------


def test_freeze_button_needs_the_permission(staff_groups):
    viewer = staff_with("view_account", "view_staffaction")
    account = funded_account()
    client = admin_client_for(viewer)
    page = client.get(account_url(account)).content.decode()
    assert 'id="dp-freeze"' not in page and 'id="dp-unfreeze"' not in page
    assert client.get(act_url(account, "freeze")).status_code == 403
    response = client.post(act_url(account, "freeze"), {"confirmed": "1", "reason": "no"})
    assert response.status_code == 403
    assert Account.objects.get(pk=account.pk).status == Account.Status.ACTIVE
    assert not StaffAction.objects.exists()


def test_freeze_then_unfreeze_from_the_account_page(staff_groups):
    officer = staff_with("view_account", "view_staffaction", "freeze_account")
    account = funded_account()
    client = admin_client_for(officer)
    page = client.get(account_url(account)).content.decode()
    assert href(act_url(account, "freeze")) in page and 'id="dp-unfreeze"' not in page
    confirm_page = client.get(act_url(account, "freeze"))
    assert confirm_page.status_code == 200 and "reason" in confirm_page.context["form"].fields
    done = client.post(act_url(account, "freeze"), {"confirmed": "1", "reason": "court order"}, follow=True)
    assert done.redirect_chain[-1][0] == account_url(account)
    assert Account.objects.get(pk=account.pk).status == Account.Status.FROZEN
    html = done.content.decode()
    assert href(act_url(account, "unfreeze")) in html and 'id="dp-freeze"' not in html
    client.post(act_url(account, "unfreeze"), {"confirmed": "1", "reason": "cleared"})
    assert Account.objects.get(pk=account.pk).status == Account.Status.ACTIVE
    assert list(StaffAction.objects.filter(account=account).order_by("id").values_list("action", "reason")) == [
        ("freeze", "court order"), ("unfreeze", "cleared")
    ]


def test_support_freezes_an_account_at_3_am_without_a_superuser(support_user):
    """A fraud freeze cannot wait for a superuser: the support group holds the freeze
    (docs/reference/admin-console.md, "Staff roles"); it still asks for a reason, and the
    staff action records it."""
    account = funded_account()
    client = admin_client_for(support_user)
    assert href(act_url(account, "freeze")) in client.get(account_url(account)).content.decode()
    listing = client.get(ACCOUNTS).content.decode()
    assert "freeze_selected" in listing and "unfreeze_selected" in listing
    asked = client.get(act_url(account, "freeze"))
    assert asked.status_code == 200 and asked.templates[0].name == "admin/confirm_act.html"
    client.post(act_url(account, "freeze"), {"confirmed": "1", "reason": "card fraud reported 03:02"})
    assert Account.objects.get(pk=account.pk).status == Account.Status.FROZEN
    action = StaffAction.objects.get(account=account)
    assert (action.action, action.actor, action.reason) == ("freeze", support_user, "card fraud reported 03:02")


# --- the user page ---------------------------------------------------------------------------


def test_user_page_links_to_their_accounts_and_payments(superuser):
    alice = UserFactory(username="alice")
    savings, checking = funded_account(owner=alice, name="Savings"), funded_account(owner=alice, name="Checking")
    bob_account = funded_account()
    paid = due_payment(source=savings, target=bob_account, amount=1, seconds_ago=-600)
    due_payment(source=bob_account, target=checking, amount=1, seconds_ago=-600)  # to alice, made by bob
    client = admin_client_for(superuser)
    response = client.get(reverse("admin:auth_user_change", args=[alice.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    for account in (savings, checking):
        assert href(account_url(account)) in html
    accounts_link = f"{ACCOUNTS}?{urlencode({'owner__id__exact': alice.pk})}"
    payments_link = f"{PAYMENTS}?{urlencode({'payer': alice.pk})}"
    assert href(accounts_link) in html and href(payments_link) in html
    assert listed(client.get(accounts_link)) == {savings.pk, checking.pk}
    assert listed(client.get(payments_link)) == {paid.pk}
    assert client.get(reverse("admin:auth_user_add")).status_code == 200  # the add page has no links


# --- polish ---------------------------------------------------------------------------------


def test_thousands_filter():
    """Integers get separators; text (an id, a key) is shown as it is; nothing at all is "-"."""
    assert [human(v) for v in (0, 999, 1000, 1234567, -2500000, "12345", None)] == [
        "0", "999", "1,000", "1,234,567", "-2,500,000", "12345", "-"
    ]


def test_balances_and_amounts_have_thousands_separators(superuser):
    account = funded_account(balance=1_234_567)
    client = admin_client_for(superuser)
    assert "1,234,567" in client.get(account_url(account)).content.decode()
    assert "1,234,567" in client.get(ACCOUNTS).content.decode()
    assert "1,234,567" in client.get(TRANSFERS).content.decode()  # its deposit


def test_favicon_is_served(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon"
    body = response.content
    assert body[:4] == b"\x00\x00\x01\x00" and b"\x89PNG" in body
    assert client.post("/favicon.ico").status_code == 405


def test_admin_pages_point_at_the_favicon(superuser):
    html = admin_client_for(superuser).get(ACCOUNTS).content.decode()
    assert '<link rel="icon" href="/favicon.ico"' in html


def test_a_403_logs_one_line_without_a_traceback(caplog):
    nobody = UserFactory(is_staff=True)
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = admin_client_for(nobody).get(ACCOUNTS)
    assert response.status_code == 403
    refused = [r for r in caplog.records if r.name == "django.request"]
    assert len(refused) == 1
    assert refused[0].exc_info is None and refused[0].exc_text is None
    assert refused[0].getMessage() == f"Forbidden (Permission denied): {ACCOUNTS}"


def test_django_lines_are_written_once():
    """Django's DEFAULT_LOGGING (applied before settings.LOGGING) puts a console handler on
    "django" that writes in DEBUG: with ours on the root, every 403 came out twice,
    traceback and all. Only the root's handler remains."""
    assert logging.getLogger("django").handlers == []
    assert logging.getLogger("django").propagate


def test_a_500_keeps_its_traceback():
    record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Internal Server Error: /x", (),
                               (ValueError, ValueError("boom"), None))
    record.status_code = 500
    assert ClientErrorWithoutTraceback().filter(record) and record.exc_info is not None


def test_403_filter_is_configured_on_django_request():
    config = logging_config(level="INFO", fmt="json")
    assert config["loggers"]["django.request"]["filters"] == ["client_errors"]
    # Django's own console handler on "django" (DEBUG) wrote every django.* line a second time.
    assert config["loggers"]["django"] == {"handlers": [], "propagate": True}
    for name in ("celery.beat", "celery.app.trace", "celery.worker.strategy"):
        assert config["loggers"][name]["filters"] == ["ticks"]


# --- make run: the per-second ticks at DEBUG -----------------------------------------------


def celery_record(name: str, task: str, *, level=logging.INFO) -> logging.LogRecord:
    if name == "celery.beat":
        return logging.LogRecord(name, level, __file__, 1, "Scheduler: Sending due task %s (%s)",
                                 ("promoter-tick", task), None)
    record = logging.LogRecord(name, level, __file__, 1, "Task %(name)s[%(id)s] received",
                               ({"name": task, "id": "1"},), None)
    record.data = {"name": task, "id": "1"}
    return record


@pytest.mark.parametrize("logger_name", ["celery.beat", "celery.app.trace", "celery.worker.strategy"])
def test_tick_lines_go_to_debug_and_other_tasks_stay_at_info(logger_name):
    logger = logging.getLogger(logger_name)
    previous = logger.level
    tick_filter = TickLinesAtDebug()
    try:
        logger.setLevel(logging.INFO)
        for task in ("payments.tasks.promoter_tick", "webhooks.tasks.dispatch"):
            record = celery_record(logger_name, task)
            assert not tick_filter.filter(record)  # dropped at INFO
            assert record.levelno == logging.DEBUG
        executed = celery_record(logger_name, "payments.tasks.execute_batch")
        assert tick_filter.filter(executed) and executed.levelno == logging.INFO
        failed_tick = celery_record(logger_name, "payments.tasks.promoter_tick", level=logging.ERROR)
        assert tick_filter.filter(failed_tick) and failed_tick.levelno == logging.ERROR
        logger.setLevel(logging.DEBUG)
        assert tick_filter.filter(celery_record(logger_name, "payments.tasks.promoter_tick"))  # shown at DEBUG
    finally:
        logger.setLevel(previous)


# --- ids in URLs as the API shows them ----------------------------------------------------------


def test_account_urls_carry_the_id_as_is_and_the_quoted_form_still_works(superuser):
    account, other = funded_account(balance=100), funded_account()
    payment = due_payment(source=account, target=other, amount=1, seconds_ago=-600)
    client = admin_client_for(superuser)
    plain = f"/admin/ledger/account/{account.pk}/change/"
    assert client.get(plain).status_code == 200
    assert client.get(reverse("admin:ledger_account_change", args=[quote(account.pk)])).status_code == 200
    listing = client.get(ACCOUNTS).content.decode()
    assert f'href="{plain}"' in listing and "_5F" not in listing
    # A payment's page links to its accounts the same way.
    page = client.get(f"/admin/payments/scheduledpayment/{payment.pk}/change/").content.decode()
    assert f'href="{plain}"' in page and "_5F" not in page
    # The confirmation page of the account's Freeze button returns to the plain URL.
    response = client.post(act_url(account, "freeze"), {"confirmed": "1", "reason": "fraud review"})
    assert response.status_code == 302 and response.url == plain
