"""Finding the customer (issue 36, point 8): the accounts list searches by account name, a
phrase is searched as one phrase, deposit requests name their account and its owner, and a
console-wide search opens whatever a pasted id or username names, among what the staff
member may view."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from common.admin_tools import change_url
from ledger.models import Account, DepositRequest
from payments.models import Payee, RecurringPayment, ScheduledPayment
from recurring.services import recurring_create
from tests.conftest import admin_client_for
from tests.factories import AccountFactory, UserFactory, funded_account, future_payment, payee_for, webhook_endpoint
from webhooks.models import Endpoint, Event

pytestmark = pytest.mark.django_db

ACCOUNTS = reverse("admin:ledger_account_changelist")
PAYMENTS = reverse("admin:payments_scheduledpayment_changelist")
DEPOSIT_REQUESTS = reverse("admin:ledger_depositrequest_changelist")
SEARCH = "/admin/search/"  # test_search_is_routed: reverse("admin-search")


def listed(response) -> set[str]:
    assert response.status_code == 200
    return {str(obj.pk) for obj in response.context["cl"].result_list}


def staff_with(*codenames: str):
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


# --- the accounts list: by name, a phrase as one phrase ------------------------------------------


def test_accounts_list_finds_an_account_by_its_name(superuser):
    wanted = AccountFactory(name="Holiday fund 2026")
    AccountFactory(name="Rent")
    client = admin_client_for(superuser)
    assert listed(client.get(ACCOUNTS, {"q": "holiday"})) == {wanted.pk}
    assert listed(client.get(ACCOUNTS, {"q": "Holiday Fund 2026"})) == {wanted.pk}
    # Owners' usernames and ids still find their accounts, several at once.
    other = AccountFactory(name="Other")
    assert listed(client.get(ACCOUNTS, {"q": f"{other.owner.username} {wanted.pk}"})) == {other.pk, wanted.pk}


def test_a_phrase_is_searched_as_one_phrase_not_as_each_word(superuser):
    """"holiday fund" once matched any name starting with "holiday" or with "fund"."""
    phrase = AccountFactory(name="Our holiday fund")
    quoted = AccountFactory(name="Holiday fund, Spain")
    AccountFactory(name="fund for the holiday")  # both words, not the phrase
    AccountFactory(name="Holiday savings")
    AccountFactory(name="Fund B")
    client = admin_client_for(superuser)
    assert listed(client.get(ACCOUNTS, {"q": "holiday fund"})) == {phrase.pk, quoted.pk}
    assert listed(client.get(ACCOUNTS, {"q": '"holiday   fund"'})) == {phrase.pk, quoted.pk}


def test_the_payments_list_searches_an_account_name_as_one_phrase(superuser):
    holiday, rent, target = (AccountFactory(name="Holiday fund", balance=0), AccountFactory(name="Fund raising"),
                             AccountFactory(name="Holiday cottage"))
    mine = future_payment(source=holiday, target=AccountFactory(name="x"))
    future_payment(source=rent, target=target)  # "fund" and "holiday", each in another account
    assert listed(admin_client_for(superuser).get(PAYMENTS, {"q": "holiday fund"})) == {mine.pk}


@pytest.mark.parametrize("query", ["", "   ", '""', "\x00", "%", "_", "a" * 5000, "'; DROP TABLE x; --"])
def test_account_search_never_fails_on_odd_input(superuser, query):
    AccountFactory(name="Holiday fund")
    assert admin_client_for(superuser).get(ACCOUNTS, {"q": query}).status_code == 200


# --- deposit requests name the account and its owner ------------------------------------------------


def deposit_request(account, requester, amount=5000) -> DepositRequest:
    return DepositRequest.objects.create(account=account, beneficiary=account.owner, amount=amount,
                                         reason="top up", requested_by=requester)


def test_deposit_requests_show_the_accounts_name_and_owner_beside_its_id(superuser):
    owner = UserFactory(username="alice")
    account = AccountFactory(owner=owner, name="Holiday fund")
    request = deposit_request(account, superuser)
    client = admin_client_for(superuser)
    html = client.get(DEPOSIT_REQUESTS).content.decode()
    row = html[html.index(request.pk):]
    row = row[: row.index("</tr>")]
    assert account.pk in row and "Holiday fund" in row and "alice" in row
    page = client.get(reverse("admin:ledger_depositrequest_change", args=[request.pk])).content.decode()
    assert "Holiday fund" in page and "alice" in page


def test_deposit_request_list_reads_accounts_and_owners_with_the_rows(superuser, django_assert_max_num_queries):
    client = admin_client_for(superuser)

    def queries_with(rows: int) -> int:
        for _ in range(rows - DepositRequest.objects.count()):
            deposit_request(AccountFactory(), superuser)
        client.get(DEPOSIT_REQUESTS)
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(DEPOSIT_REQUESTS)
        assert len(response.context["cl"].result_list) == rows
        return len(ctx.captured_queries)

    assert queries_with(2) == queries_with(20)


# --- the console-wide search --------------------------------------------------------------------


def test_search_is_routed():
    assert reverse("admin-search") == SEARCH


@pytest.fixture
def world():
    """One object of every kind a pasted id may name."""
    alice = UserFactory(username="alice")
    source = funded_account(owner=alice, balance=100, name="Holiday fund")
    target = AccountFactory(name="Rent")
    webhook_endpoint(alice)
    payment = future_payment(source=source, target=target)
    rec = recurring_create(payer=alice, from_account_id=source.id, to_account_id=target.id, amount=7,
                           start_at=timezone.now() + timedelta(hours=1), interval="P1D")
    return {
        "payment": payment,
        "account": source,
        "recurring": RecurringPayment.objects.get(pk=rec.pk),
        "payee": payee_for(alice),
        "endpoint": Endpoint.objects.get(owner=alice),
        "event": Event.objects.create(type="payment.executed", owner=alice, payment_id=payment.pk, version=1,
                                      snapshot={}),
        "deposit request": deposit_request(source, UserFactory()),
        "user": alice,
    }


def pasted_id(obj) -> str:
    return obj.public_id if isinstance(obj, Event) else obj.get_username() if hasattr(obj, "get_username") else obj.pk


@pytest.mark.parametrize("kind", ["payment", "account", "recurring", "payee", "endpoint", "event", "deposit request",
                                  "user"])
def test_a_pasted_id_or_username_opens_that_objects_page(superuser, world, kind):
    obj = world[kind]
    assert obj is not None
    response = admin_client_for(superuser).get(SEARCH, {"q": f"  {pasted_id(obj)} "})
    assert response.status_code == 302
    assert response["Location"] == change_url(type(obj), obj.pk)


def test_the_id_prefixes_the_search_knows_are_the_ones_the_models_mint(world):
    from console.search import ID_KINDS

    for kind in ID_KINDS:
        sample = kind.model._default_manager.first()
        assert sample is not None, kind.noun
        pasted = sample.public_id if kind.model is Event else sample.pk
        assert pasted.startswith(kind.prefix), (kind.prefix, pasted)


def test_an_id_in_another_case_is_found(superuser, world):
    payment = world["payment"]
    response = admin_client_for(superuser).get(SEARCH, {"q": payment.pk.lower()})
    assert response["Location"] == change_url(ScheduledPayment, payment.pk)


def test_several_matches_are_listed(superuser, world):
    payment, account = world["payment"], world["account"]
    response = admin_client_for(superuser).get(SEARCH, {"q": f"{payment.pk}, {account.pk}"})
    assert response.status_code == 200
    assert {m.url for m in response.context["matches"]} == {
        change_url(ScheduledPayment, payment.pk), change_url(Account, account.pk)
    }
    html = response.content.decode()
    assert "Holiday fund" in html and "alice" in html


def test_an_account_name_is_searched_when_no_id_or_username_matches(superuser, world):
    AccountFactory(name="Holiday fund 2027")
    response = admin_client_for(superuser).get(SEARCH, {"q": "holiday fund"})
    assert response.status_code == 200
    assert len(response.context["matches"]) == 2
    assert admin_client_for(superuser).get(SEARCH, {"q": "Rent"})["Location"] == change_url(
        Account, Account.objects.get(name="Rent").pk
    )


@pytest.mark.parametrize("query", ["", "   ", "\x00", "pay_", "evt_", "evt_abc", "evt_" + "9" * 40, "acc_nothing",
                                   "%%%", "a" * 5000, "nobody-has-this-name", "<script>x</script>"])
def test_nothing_found_or_nothing_asked_is_a_page_that_says_so(superuser, world, query):
    response = admin_client_for(superuser).get(SEARCH, {"q": query})
    assert response.status_code == 200
    html = response.content.decode()
    assert ("dp-search-nothing" in html) or ("dp-search-empty" in html)
    assert "<script>x</script>" not in html


def test_a_staff_member_without_the_view_permission_is_told_nothing_they_may_see(world):
    """A groupless staff member who pastes an existing payment's id reads the same page as
    for an id that does not exist: the search does not tell which ids exist."""
    client = admin_client_for(UserFactory(is_staff=True))
    existing = client.get(SEARCH, {"q": world["payment"].pk})
    missing = client.get(SEARCH, {"q": "pay_01NOTHINGATALL000000000000"})
    for response in (existing, missing):
        assert response.status_code == 200
        assert "Nothing you may see matches" in response.content.decode()
    assert existing.context["matches"] == missing.context["matches"] == []


def test_each_kind_needs_its_own_view_permission(world):
    """Payments visible, accounts not: a payment id opens, an account id says nothing."""
    client = admin_client_for(staff_with("view_scheduledpayment"))
    assert client.get(SEARCH, {"q": world["payment"].pk}).status_code == 302
    response = client.get(SEARCH, {"q": world["account"].pk})
    assert response.status_code == 200 and response.context["matches"] == []


def test_a_username_opens_the_users_account_for_staff_who_may_not_view_users(support_user, world):
    """Support may not view users (auth.view_user): alice's one account opens instead."""
    response = admin_client_for(support_user).get(SEARCH, {"q": "alice"})
    assert response["Location"] == change_url(Account, world["account"].pk)


def test_the_search_box_is_on_the_front_page_and_in_every_console_pages_header(superuser, world):
    client = admin_client_for(superuser)
    front = client.get(reverse("admin:index")).content.decode()
    assert 'id="dp-front-search"' in front
    for url in (reverse("admin:index"), PAYMENTS, ACCOUNTS, reverse("admin-dashboard"), reverse("admin-limits"),
                change_url(ScheduledPayment, world["payment"].pk), reverse("admin:payments_payee_changelist"),
                SEARCH):
        html = client.get(url).content.decode()
        assert 'id="dp-global-search"' in html and f'action="{SEARCH}"' in html, url


def test_the_login_page_has_no_search_box(client):
    assert 'id="dp-global-search"' not in client.get(reverse("admin:login")).content.decode()


def test_search_results_read_one_query_a_kind(superuser, world, django_assert_max_num_queries):
    """Many ids pasted: the queries do not grow with them."""
    client = admin_client_for(superuser)
    payments = [future_payment(source=world["account"], target=AccountFactory()) for _ in range(8)]

    def queries_for(ids) -> int:
        client.get(SEARCH, {"q": " ".join(ids)})
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(SEARCH, {"q": " ".join(ids)}).status_code == 200
        return len(ctx.captured_queries)

    assert queries_for([p.pk for p in payments[:2]]) == queries_for([p.pk for p in payments])


def test_payee_admin_is_what_the_search_opens(superuser, world):
    payee = world["payee"]
    response = admin_client_for(superuser).get(SEARCH, {"q": payee.pk}, follow=True)
    assert response.status_code == 200 and isinstance(response.context["original"], Payee)
