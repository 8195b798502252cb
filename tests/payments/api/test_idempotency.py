"""Idempotency-Key on POST /payments and deposits: Stripe's semantics, the IETF draft's
codes, scoped to the actor, safe under concurrent twins."""

import json
from contextlib import contextmanager
from datetime import timedelta
from functools import partial

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from payments import idempotency
from payments.models import IdempotencyKey, ScheduledPayment
from tests.api import assert_error, payment_body, post
from tests.concurrency import run_concurrently, start_thread, wait_for_lock_waiters
from tests.conftest import client_for
from tests.factories import UserFactory, funded_account

URL = "/api/v1/payments"


@pytest.fixture
def accounts(user):
    return funded_account(owner=user, balance=100), funded_account()


@pytest.mark.django_db
def test_a_quoted_key_is_the_same_key_as_the_bare_one(api, accounts):
    body = payment_body(*accounts)
    first = post(api, URL, body, key="rent-2030-01")
    replay = post(api, URL, body, key='"rent-2030-01"')
    assert first.status_code == replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert IdempotencyKey.objects.get().key == "rent-2030-01"


@pytest.mark.django_db
def test_a_quoted_key_may_escape_quotes_and_backslashes(api, accounts):
    body = payment_body(*accounts)
    assert post(api, URL, body, key=r'"a\"b\\c"').status_code == 201
    assert IdempotencyKey.objects.get().key == 'a"b\\c'
    assert post(api, URL, body, key='a"b\\c')["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
# A bare key may not hold a comma (two headers arrive joined by one): test_http_edges.py.
@pytest.mark.parametrize(
    "key", ["k", "x" * 255, "a b", "~!#$%&'()*+-./:;<=>?@[]^_`{|}", '"' + "y" * 255 + '"', '"a,b"']
)
def test_keys_of_1_to_255_printable_ascii_are_accepted(api, accounts, key):
    assert post(api, URL, payment_body(*accounts), key=key).status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key",
    ["", "  ", '""', '"', '"abc', 'abc"', "x" * 256, '"' + "y" * 256 + '"', "caf\u00e9", "a\tb", '"a"b"', r'"a\x"'],
    ids=["empty", "blank", "empty-quoted", "lone-quote", "open-quote", "close-quote", "256", "quoted-256",
         "non-ascii", "tab", "inner-quote", "bad-escape"],
)
def test_malformed_keys_are_400_idempotency_key_invalid(api, accounts, key):
    assert_error(post(api, URL, payment_body(*accounts), key=key), 400, "idempotency_key_invalid")
    assert not ScheduledPayment.objects.exists()


@pytest.mark.django_db
def test_a_deposit_without_a_key_is_400(staff_api):
    account = funded_account()
    assert_error(post(staff_api, f"/api/v1/accounts/{account.id}/deposits", {"amount": 5}), 400,
                 "idempotency_key_required")


@pytest.mark.django_db
def test_the_body_is_compared_as_canonical_json(api, accounts):
    body = payment_body(*accounts)
    first = post(api, URL, json.dumps(body), key="k")
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=4)
    replay = post(api, URL, reordered, key="k")
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.content == first.content


@pytest.mark.django_db
def test_a_replay_returns_the_original_response_even_after_the_payment_changed(api, accounts):
    body = payment_body(*accounts)
    first = post(api, URL, body, key="k")
    assert api.delete(f"{URL}/{first.json()['payment_id']}").json()["status"] == "CANCELLED"
    replay = post(api, URL, body, key="k")
    assert replay.content == first.content  # the first response, byte for byte: SCHEDULED
    assert ScheduledPayment.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_on_another_endpoint_is_409_reused(api, staff_api, user, accounts):
    assert post(api, URL, payment_body(*accounts), key="k").status_code == 201
    assert_error(post(api, "/api/v1/payments", {**payment_body(*accounts), "amount": 7}, key="k"), 409,
                 "idempotency_key_reused")


@pytest.mark.django_db
def test_a_rejected_request_stores_nothing_so_the_key_can_be_reused(api, accounts):
    assert post(api, URL, payment_body(*accounts, amount=0), key="k").status_code == 400
    assert not IdempotencyKey.objects.exists()
    fixed = post(api, URL, payment_body(*accounts), key="k")
    assert fixed.status_code == 201 and "Idempotent-Replayed" not in fixed


@pytest.mark.django_db
def test_keys_are_scoped_to_the_actor_and_never_replay_another_users_response(api, accounts):
    body = payment_body(*accounts)
    assert post(api, URL, body, key="shared").status_code == 201
    intruder = client_for(UserFactory())
    # The same key and the very same body: no replay of the first user's payment.
    response = post(intruder, URL, body, key="shared")
    assert_error(response, 400, "validation_error")
    assert "Idempotent-Replayed" not in response
    assert ScheduledPayment.objects.count() == 1


@pytest.mark.django_db
def test_a_replayed_deposit_moves_money_once(staff_api):
    account = funded_account()
    url = f"/api/v1/accounts/{account.id}/deposits"
    body = {"amount": 10, "reason": "r"}
    first = post(staff_api, url, body, key='"dep-1"')
    replays = [post(staff_api, url, body, key="dep-1") for _ in range(3)]
    assert {r.content for r in replays} == {first.content}
    account.refresh_from_db()
    assert account.balance == 10
    assert_error(post(staff_api, url, {**body, "amount": 11}, key="dep-1"), 409, "idempotency_key_reused")


# --- concurrent twins ----------------------------------------------------------------------


def _twin_outcome(response) -> str:
    assert response.status_code < 500, response.content
    if response.status_code == 201:
        return "replayed" if response.get("Idempotent-Replayed") == "true" else "created"
    assert_error(response, 409, "idempotency_key_in_use")
    return "in_use"


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_requests_with_one_key_create_exactly_one_payment(user, accounts):
    client, twin = client_for(user), client_for(user)
    for round_ in range(8):
        body, key = payment_body(*accounts, amount=round_ + 1), f"race-{round_}"
        responses = run_concurrently(*(partial(post, c, URL, body, key=key) for c in (client, twin)))
        outcomes = sorted(_twin_outcome(r) for r in responses)
        assert outcomes in (["created", "replayed"], ["created", "in_use"]), outcomes
        assert ScheduledPayment.objects.filter(amount=round_ + 1).count() == 1
    assert client.get(URL).json()["items"].__len__() == 8


@contextmanager
def event_table_locked():
    """Hold a SHARE lock on the payment event table: a create that got as far as writing
    its event waits there, holding its uncommitted idempotency key, until the block
    ends. This makes "the first request is still running" deterministic."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("LOCK TABLE payments_paymentevent IN SHARE MODE")
        yield


@pytest.mark.django_db(transaction=True)
def test_a_twin_waits_for_the_first_request_and_replays_its_response(user, accounts):
    body = payment_body(*accounts)
    client, twin_client = client_for(user), client_for(user)
    with event_table_locked():
        first = start_thread(lambda: post(client, URL, body, key="k"))
        wait_for_lock_waiters(1)  # the first holds its key and waits on the event table
        twin = start_thread(lambda: post(twin_client, URL, body, key="k"))
        wait_for_lock_waiters(2)  # the twin waits on the first's key
    first_response, twin_response = first(), twin()
    assert first_response.status_code == 201 and "Idempotent-Replayed" not in first_response
    assert twin_response.status_code == 201 and twin_response["Idempotent-Replayed"] == "true"
    assert twin_response.content == first_response.content
    assert ScheduledPayment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_twin_with_another_body_waits_then_gets_409_reused(user, accounts):
    client, twin_client = client_for(user), client_for(user)
    with event_table_locked():
        first = start_thread(lambda: post(client, URL, payment_body(*accounts, amount=1), key="k"))
        wait_for_lock_waiters(1)
        twin = start_thread(lambda: post(twin_client, URL, payment_body(*accounts, amount=2), key="k"))
        wait_for_lock_waiters(2)
    assert first().status_code == 201
    assert_error(twin(), 409, "idempotency_key_reused")
    assert ScheduledPayment.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_twin_that_waits_too_long_gets_409_in_use_and_can_retry(user, accounts, monkeypatch):
    monkeypatch.setattr(idempotency, "KEY_LOCK_TIMEOUT", "200ms")
    body = payment_body(*accounts)
    client, twin_client = client_for(user), client_for(user)
    with event_table_locked():
        first = start_thread(lambda: post(client, URL, body, key="k"))
        wait_for_lock_waiters(1)
        assert_error(post(twin_client, URL, body, key="k"), 409, "idempotency_key_in_use")
    assert first().status_code == 201
    retry = post(twin_client, URL, body, key="k")
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"
    assert ScheduledPayment.objects.count() == 1


# --- retention ------------------------------------------------------------------------------



@pytest.mark.django_db
def test_purge_command_deletes_keys_older_than_24_hours_only(api, accounts):
    for i in range(3):
        assert post(api, URL, payment_body(*accounts, amount=i + 1), key=f"k{i}").status_code == 201
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_idempotencykey SET created_at = now() - interval '25 hours' WHERE key <> 'k2'")
    call_command("purge_idempotency_keys")
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["k2"]
    # A purged key is free again: a new request with it creates a new payment.
    assert "Idempotent-Replayed" not in post(api, URL, payment_body(*accounts, amount=1), key="k0")


@pytest.mark.django_db
def test_beat_purges_the_keys_hourly_without_a_cron(api, accounts):
    from payments import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["purge-idempotency-keys"]
    assert (entry["task"], entry["schedule"], entry["options"]["queue"]) == (
        tasks.purge_idempotency_keys.name, 3600.0, "execute")
    for i in range(2):
        assert post(api, URL, payment_body(*accounts, amount=i + 1), key=f"k{i}").status_code == 201
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_idempotencykey SET created_at = now() - interval '25 hours' WHERE key = 'k0'")
    assert tasks.purge_idempotency_keys() == {"deleted": 1}
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["k1"]


@pytest.mark.django_db
def test_purge_never_deletes_keys_younger_than_24_hours(api, accounts):
    assert post(api, URL, payment_body(*accounts), key="k").status_code == 201
    with connection.cursor() as cur:
        cur.execute("UPDATE payments_idempotencykey SET created_at = now() - interval '23 hours'")
    assert idempotency.idempotency_keys_purge(older_than=timedelta(hours=1)) == 0
    with pytest.raises(CommandError):
        call_command("purge_idempotency_keys", "--hours", "1")
    assert IdempotencyKey.objects.count() == 1
