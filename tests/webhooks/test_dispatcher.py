"""The dispatcher against a loopback receiver: fan-out, signatures, retries, the ladder,
disabling, leases, rotation, resend, and what the payload says."""

import json
import logging
import time
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from payments.execution import execute_batch
from recurring.services import recurring_create, recurring_pause
from tests.conftest import client_for
from tests.factories import (
    UserFactory,
    claimed,
    due_payment,
    due_time,
    funded_account,
    future_payment,
    webhook_endpoint,
)
from webhooks import dispatcher, events
from webhooks.dispatcher import claim_deliveries, dispatch_once, fan_out
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, Event, new_secret
from webhooks.services import delivery_resend


def endpoint_for(user, url: str, types=(events.PAYMENT_EXECUTED,), **kwargs) -> Endpoint:
    return webhook_endpoint(user, url=url, types=types, **kwargs)


def executed_payment(amount: int = 5):
    """A payment executed, and its payment.executed event in the outbox, not fanned out yet.
    The outbox writes an event only for an owner with an enabled endpoint subscribed to its
    type (webhooks/0006): a listener endpoint is there for the execution and gone before the
    test makes its own endpoints, so the fan-out reaches exactly those."""
    a, b = funded_account(balance=100), funded_account()
    payment = due_payment(source=a, target=b, amount=amount)
    listener = endpoint_for(a.owner, "https://listener.example.com/hook")
    assert execute_batch(pairs=claimed(payment)).executed == [payment.id]
    listener.delete()
    return payment


def make_due(delivery: Delivery) -> None:
    """Skip the wait on the ladder (or an expired lease). Well in the past: a test's
    transaction has one now(), from its start (Now() is the statement's time)."""
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=Now() - timedelta(hours=1))


def verify(secret: str, request) -> dict:
    return Webhook(secret).verify(request.body, request.headers)


@pytest.mark.django_db
def test_fan_out_reaches_the_owners_subscribed_enabled_endpoints_only(receiver):
    payment = executed_payment()
    owner, stranger = payment.payer, UserFactory()
    subscribed = endpoint_for(owner, receiver.url)
    endpoint_for(owner, receiver.url, types=[events.PAYMENT_CANCELLED])
    endpoint_for(owner, receiver.url, enabled=False)
    endpoint_for(stranger, receiver.url)
    assert fan_out() == (1, 1)
    (delivery,) = Delivery.objects.all()
    assert delivery.endpoint_id == subscribed.id
    assert Event.objects.get().fanned_out_at is not None
    assert fan_out() == (0, 0)  # fanned out once


@pytest.mark.django_db
def test_a_terminal_event_whose_payment_was_archived_carries_its_id_and_final_status(receiver):
    # A terminal event has no snapshot (the frozen row is read at delivery); when the
    # payment's month has been archived since (a resend, months later), the row is gone.
    payment = executed_payment()
    endpoint = endpoint_for(payment.payer, receiver.url)
    Event.objects.filter(payment_id=payment.id).update(payment_id="pay_01ARCHIVED00000000000000000")
    dispatch_once()
    (request,) = receiver.requests
    payload = verify(endpoint.secret, request)
    assert payload["data"] == {"id": "pay_01ARCHIVED00000000000000000", "status": "EXECUTED"}


@pytest.mark.django_db
def test_a_delivery_is_signed_per_standard_webhooks_and_says_what_the_api_says(receiver):
    payment = executed_payment()
    endpoint = endpoint_for(payment.payer, receiver.url)
    result = dispatch_once()
    assert (result.fanned_out, result.claimed, result.succeeded) == (1, 1, 1)
    (request,) = receiver.requests
    payload = verify(endpoint.secret, request)
    event = Event.objects.get()
    assert request.headers["webhook-id"] == payload["id"] == f"evt_{event.id}"
    assert request.headers["content-type"] == "application/json"
    assert payload["type"] == "payment.executed"
    assert payload["created_at"].endswith("Z")
    shown = client_for(payment.payer).get(f"/api/v1/payments/{payment.id}").json()
    shown.pop("attempts")
    assert payload["data"] == shown  # rendered from the snapshot by the API's serializer
    assert payload["data"]["version"] == event.version
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("succeeded", 1, 204)
    (attempt,) = DeliveryAttempt.objects.all()
    assert (attempt.attempt, attempt.status_code, attempt.error) == (1, 204, "")
    assert attempt.latency_ms >= 0
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(request.body, request.headers)


@pytest.mark.django_db
def test_a_failed_payment_carries_its_failure_reason(receiver):
    a, b = funded_account(balance=1), funded_account()
    payment = due_payment(source=a, target=b, amount=50)
    endpoint = endpoint_for(a.owner, receiver.url, types=[events.PAYMENT_FAILED])
    execute_batch(pairs=claimed(payment))
    dispatch_once()
    payload = verify(endpoint.secret, receiver.requests[0])
    assert (payload["type"], payload["data"]["status"]) == ("payment.failed", "FAILED")
    assert payload["data"]["failure_reason"] == "insufficient_funds"


@pytest.mark.django_db
def test_a_recurring_payment_event_shows_the_series(receiver):
    a, b = funded_account(), funded_account()
    rec = recurring_create(
        payer=a.owner, from_account_id=a.id, to_account_id=b.id, amount=3,
        start_at=timezone.now() + timedelta(hours=1), interval="P1D",
    )  # fmt: skip
    endpoint = endpoint_for(a.owner, receiver.url, types=[events.RECURRING_PAUSED])
    recurring_pause(recurring_id=rec.id, actor=a.owner)
    dispatch_once()
    payload = verify(endpoint.secret, receiver.requests[0])
    assert payload["type"] == "recurring_payment.paused"
    assert (payload["data"]["recurring_id"], payload["data"]["status"]) == (rec.id, "PAUSED")
    assert payload["data"]["next_occurrence_at"] is None


@pytest.mark.django_db
def test_500_then_success_with_the_same_webhook_id(receiver):
    answers = iter([500, 204])
    receiver.answer = lambda r: (next(answers), b"oops" if r else b"", {})
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    # The ladder counts from the database's now(), in this test's transaction its start:
    # under load the set-up above can take longer than the ladder's 0.1 s of slack.
    before = due_time(0)
    first = dispatch_once()
    assert (first.retrying, first.succeeded) == (1, 0)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
    assert delivery.last_error == "HTTP 500" and delivery.lease_until is None
    # The first step of the ladder is 5 s, +-20 %: not due again yet.
    assert before + timedelta(seconds=3.9) <= delivery.next_attempt_at <= timezone.now() + timedelta(seconds=6.1)
    assert dispatch_once().claimed == 0
    make_due(delivery)
    assert dispatch_once().succeeded == 1
    first_try, second_try = receiver.requests
    assert first_try.headers["webhook-id"] == second_try.headers["webhook-id"]
    assert first_try.body == second_try.body
    tries = list(DeliveryAttempt.objects.order_by("id").values_list("attempt", "status_code", "response_body"))
    assert tries == [(1, 500, "oops"), (2, 204, "")]


@pytest.mark.django_db
def test_the_ladder_ends_in_failed_and_a_long_failing_endpoint_is_disabled(receiver, settings):
    settings.DELAYPAY_WEBHOOK_RETRY_DELAYS = [10, 100]
    receiver.answer = lambda r: (503, b"", {})
    payment = executed_payment()
    endpoint = endpoint_for(payment.payer, receiver.url)
    dispatch_once()
    delivery = Delivery.objects.get()
    for expected in ("pending", "failed"):
        make_due(delivery)
        dispatch_once()
        delivery.refresh_from_db()
        assert delivery.status == expected
    assert delivery.attempts == 3 and len(receiver.requests) == 3  # first try + one per step
    make_due(delivery)
    assert dispatch_once().claimed == 0  # failed is final (until a resend)
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is not None  # failing, not for long yet

    # Failing for longer than DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS without a success: disabled.
    Endpoint.objects.filter(pk=endpoint.pk).update(failing_since=Now() - timedelta(days=5, minutes=1))
    second = executed_payment()
    Endpoint.objects.filter(pk=endpoint.pk).update(owner=second.payer)
    result = dispatch_once()
    assert result.disabled_endpoints == [endpoint.id]
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason.startswith("failing since ")
    assert endpoint.version == 2

    # What is still pending for it fails without a request; a resend brings it back.
    third = executed_payment()
    make_due(Delivery.objects.create(event=Event.objects.get(payment_id=third.id), endpoint=endpoint))
    requests_before = len(receiver.requests)
    assert dispatch_once().failed == 1
    assert len(receiver.requests) == requests_before
    assert Delivery.objects.get(event__payment_id=third.id).last_error == "endpoint disabled"


@pytest.mark.django_db
def test_a_success_ends_the_failing_run(receiver):
    answers = iter([500, 200])
    receiver.answer = lambda r: (next(answers), b"", {})
    payment = executed_payment()
    endpoint = endpoint_for(payment.payer, receiver.url)
    dispatch_once()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is not None
    make_due(Delivery.objects.get())
    dispatch_once()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None


def test_the_ladder_jitters_within_20_percent(settings):
    settings.DELAYPAY_WEBHOOK_RETRY_DELAYS = [100.0, 1000.0]
    draws = [dispatcher.next_delay(1) for _ in range(200)]
    assert all(80 <= d <= 120 for d in draws) and len(set(draws)) > 150
    assert 800 <= dispatcher.next_delay(2) <= 1200
    assert dispatcher.next_delay(3) is None


def test_the_default_ladder_lasts_about_three_days(settings):
    assert len(settings.DELAYPAY_WEBHOOK_RETRY_DELAYS) == 10
    assert 2.8 < sum(settings.DELAYPAY_WEBHOOK_RETRY_DELAYS) / 86400 < 3.0


@pytest.mark.django_db
def test_an_expired_lease_is_delivered_again_and_the_late_record_changes_nothing(receiver):
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    fan_out()
    (lost,) = claim_deliveries()  # a dispatcher that died before its POST
    assert dispatch_once().claimed == 0  # leased: not due
    make_due(Delivery.objects.get())  # the lease expires
    assert dispatch_once().succeeded == 1
    assert len(receiver.requests) == 1
    # The first dispatcher wakes up and records a failure: fenced out by the lease.
    late = dispatcher.Try(delivery=lost, started_at=timezone.now(), latency_ms=1, status_code=500, error="HTTP 500")
    dispatcher.record([late], disabled=[], released=[], result=dispatcher.DispatchResult())
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("succeeded", 1)
    assert DeliveryAttempt.objects.count() == 2  # the try happened: recorded all the same


@pytest.mark.django_db
def test_during_a_rotation_both_secrets_sign(receiver):
    payment = executed_payment()
    old, new = new_secret(), new_secret()
    endpoint_for(
        payment.payer, receiver.url, secret=new, previous_secret=old,
        previous_secret_expires_at=timezone.now() + timedelta(hours=24),
    )  # fmt: skip
    dispatch_once()
    (request,) = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    assert verify(old, request)["type"] == verify(new, request)["type"] == "payment.executed"


@pytest.mark.django_db
def test_an_expired_previous_secret_no_longer_signs(receiver):
    payment = executed_payment()
    old, new = new_secret(), new_secret()
    endpoint_for(
        payment.payer, receiver.url, secret=new, previous_secret=old,
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    dispatch_once()
    (request,) = receiver.requests
    assert verify(new, request)
    with pytest.raises(WebhookVerificationError):
        verify(old, request)


@pytest.mark.django_db
def test_resend_delivers_again_with_the_same_id(receiver):
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    dispatch_once()
    delivery = delivery_resend(delivery_id=Delivery.objects.get().pk, actor=payment.payer)
    assert (delivery.status, delivery.attempts) == ("pending", 0)
    assert dispatch_once().succeeded == 1
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert DeliveryAttempt.objects.count() == 2


@pytest.mark.django_db
def test_resend_of_an_unknown_delivery_is_not_found():
    from webhooks.exceptions import DeliveryNotFound

    with pytest.raises(DeliveryNotFound):
        delivery_resend(delivery_id=123456789, actor=None)


@pytest.mark.django_db
def test_the_answer_is_read_up_to_a_cap_and_kept_to_1_kib(receiver):
    receiver.answer = lambda r: (200, b"x" * (2 * 1024 * 1024), {})
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    started = time.monotonic()
    assert dispatch_once().succeeded == 1
    assert time.monotonic() - started < 5
    assert DeliveryAttempt.objects.get().response_body == "x" * 1024


@pytest.mark.django_db
def test_redirects_are_not_followed(receiver):
    receiver.answer = lambda r: (302, b"", {"Location": receiver.url + "/elsewhere"})
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    assert dispatch_once().retrying == 1
    assert [r.path for r in receiver.requests] == ["/hook"]
    assert Delivery.objects.get().last_status_code == 302


@pytest.mark.django_db
def test_a_slow_receiver_times_out_and_is_retried(receiver, settings):
    settings.DELAYPAY_WEBHOOK_TIMEOUT_SECONDS = 0.3

    def slow(request):
        time.sleep(1.0)
        return 204, b"", {}

    receiver.answer = slow
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    assert dispatch_once().retrying == 1
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None and "Timeout" in attempt.error
    assert attempt.latency_ms < 900


@pytest.mark.django_db
def test_an_unreachable_receiver_is_retried(receiver):
    payment = executed_payment()
    url = receiver.url
    receiver.stop()
    endpoint_for(payment.payer, url)
    assert dispatch_once().retrying == 1
    assert "ConnectError" in DeliveryAttempt.objects.get().error


@pytest.mark.django_db
def test_deliveries_of_one_batch_run_concurrently(receiver, settings):
    settings.DELAYPAY_WEBHOOK_DELIVERY_THREADS = 8

    def slow(request):
        time.sleep(0.3)
        return 204, b"", {}

    receiver.answer = slow
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1) for _ in range(8)]
    endpoint_for(a.owner, receiver.url)
    execute_batch(pairs=claimed(*payments))
    started = time.monotonic()
    assert dispatch_once().succeeded == 8
    assert time.monotonic() - started < 1.5  # not 8 x 0.3 s
    ids = {json.loads(r.body)["data"]["payment_id"] for r in receiver.requests}
    assert ids == {p.id for p in payments}


@pytest.mark.django_db
def test_cancel_before_due_is_delivered(receiver):
    from payments.services import payment_cancel

    a, b = funded_account(balance=10), funded_account()
    payment = future_payment(source=a, target=b)
    endpoint = endpoint_for(a.owner, receiver.url, types=[events.PAYMENT_CANCELLED])
    payment_cancel(payment_id=payment.id, actor=a.owner)
    dispatch_once()
    payload = verify(endpoint.secret, receiver.requests[0])
    assert (payload["type"], payload["data"]["status"]) == ("payment.cancelled", "CANCELLED")
    assert payload["data"]["cancelled_at"].endswith("Z")


@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatchers_deliver_each_event_once(receiver, settings):
    from tests.concurrency import run_concurrently

    settings.DELAYPAY_WEBHOOK_DELIVERY_BATCH = 5

    def slow(request):
        time.sleep(0.05)
        return 204, b"", {}

    receiver.answer = slow
    a, b = funded_account(balance=100), funded_account()
    payments = [due_payment(source=a, target=b, amount=1) for _ in range(20)]
    endpoint_for(a.owner, receiver.url)
    execute_batch(pairs=claimed(*payments))
    results = run_concurrently(*[lambda: dispatcher.dispatch(budget_seconds=10) for _ in range(3)])
    assert sum(r.succeeded for r in results) == 20
    ids = [json.loads(r.body)["data"]["payment_id"] for r in receiver.requests]
    assert sorted(ids) == sorted(p.id for p in payments)  # each once: SKIP LOCKED and leases
    assert Delivery.objects.filter(status="succeeded").count() == 20


@pytest.mark.django_db(transaction=True)
def test_no_row_lock_is_held_while_the_receiver_answers(receiver):
    """The POST happens outside any transaction: while the receiver is answering, another
    connection can lock the delivery, its event and its endpoint at once (NOWAIT)."""
    from django.db import connections

    locked_ok = []

    def check_locks(request):
        other = connections.create_connection("default")
        try:
            with other.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("SELECT 1 FROM webhooks_delivery FOR UPDATE NOWAIT")
                cur.execute("SELECT 1 FROM webhooks_event FOR UPDATE NOWAIT")
                cur.execute("SELECT 1 FROM webhooks_endpoint FOR UPDATE NOWAIT")
                cur.execute("SELECT 1 FROM payments_scheduledpayment FOR UPDATE NOWAIT")
                cur.execute("ROLLBACK")
            locked_ok.append(True)
        finally:
            other.close()
        return 204, b"", {}

    receiver.answer = check_locks
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    assert dispatch_once().succeeded == 1
    assert locked_ok == [True]


@pytest.mark.django_db
def test_a_delivery_never_logs_the_receivers_url(receiver, caplog):
    """A receiver's URL may carry its owner's token; httpx would log it with every request."""
    caplog.set_level(logging.DEBUG, logger="webhooks")
    payment = executed_payment()
    endpoint_for(payment.payer, f"{receiver.url}?token=s3cret-of-the-owner")
    assert dispatch_once().succeeded == 1
    assert len(receiver.requests) == 1
    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING
    assert "s3cret-of-the-owner" not in caplog.text


# --- the watch between ticks (docs/decisions/0018-prompt-webhooks.md) -------------------


@pytest.mark.django_db
def test_work_waiting_sees_an_event_and_a_due_delivery_but_not_a_leased_one(receiver):
    payment = executed_payment()
    endpoint_for(payment.payer, receiver.url)
    assert dispatcher.work_waiting()  # the event, not fanned out
    assert fan_out() == (1, 1)
    assert dispatcher.work_waiting()  # its delivery, due at once
    (claim,) = claim_deliveries()
    assert not dispatcher.work_waiting()  # leased: due again only when the lease ends
    make_due(Delivery.objects.get(pk=claim.id))
    assert dispatcher.work_waiting()


@pytest.mark.django_db(transaction=True)
def test_a_watching_dispatch_delivers_an_event_committed_after_it_went_idle(receiver, settings):
    """Nothing to do when the dispatch starts; a payment executes while it watches, and its
    event reaches the receiver within a few polls of the commit, before the watch ends."""
    import threading

    from tests.concurrency import start_thread

    settings.DELAYPAY_WEBHOOK_POLL_SECONDS = 0.05
    arrived = threading.Event()

    def answer(request):
        arrived.set()
        return 204, b"", {}

    receiver.answer = answer
    a, b = funded_account(balance=100), funded_account()
    endpoint_for(a.owner, receiver.url)
    payment = due_payment(source=a, target=b, amount=5)
    watching = threading.Event()
    join = start_thread(lambda: dispatcher.dispatch(watch_seconds=5, stopping=lambda: watching.set() or False))
    assert watching.wait(timeout=10)  # the first round found nothing: the dispatch is watching
    assert execute_batch(pairs=claimed(payment)).executed == [payment.id]
    committed = time.monotonic()
    assert arrived.wait(timeout=4)
    assert time.monotonic() - committed < 1.0
    result = join()
    assert (result.fanned_out, result.succeeded) == (1, 1)
    assert Delivery.objects.get().status == "succeeded"


@pytest.mark.django_db
def test_the_watch_is_off_with_a_poll_of_zero_and_ends_when_the_worker_stops(settings):
    settings.DELAYPAY_WEBHOOK_POLL_SECONDS = 0
    started = time.monotonic()
    assert not dispatcher.dispatch(watch_seconds=30).busy
    settings.DELAYPAY_WEBHOOK_POLL_SECONDS = 0.05
    assert not dispatcher.dispatch(watch_seconds=30, stopping=lambda: True).busy
    assert time.monotonic() - started < 5  # neither waited for its 30 s


@pytest.mark.parametrize(
    ("should_stop", "should_terminate", "stopping"),
    [(None, None, False), (False, None, False), (0, None, True), (1, None, True), (None, True, True)],
)
def test_the_task_stops_watching_on_a_warm_or_cold_shutdown(monkeypatch, should_stop, should_terminate, stopping):
    # A warm shutdown sets should_stop to exit code 0: falsy, yet a shutdown.
    from celery.worker import state

    from webhooks.tasks import worker_stopping

    monkeypatch.setattr(state, "should_stop", should_stop)
    monkeypatch.setattr(state, "should_terminate", should_terminate)
    assert worker_stopping() is stopping
