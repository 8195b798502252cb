"""The primary drops the connection in the middle of a create (a failover, a restart): the
client gets 503 database_unavailable with Retry-After, never a 500; nothing is half
written; the same process answers the next request on a new connection (no restart); and
the retry with the same Idempotency-Key makes exactly one payment. Real PostgreSQL: the
backend is terminated by pg_terminate_backend from another session, as a primary's death
ends it."""

import pytest
from django.db import close_old_connections, connection

from payments.models import IdempotencyKey, ScheduledPayment
from tests.api import assert_error, payment_body, post
from tests.concurrency import other_session
from tests.factories import funded_account
from tests.ops.scrape import delta, scrape

URL = "/api/v1/payments"


def request(send, *args, **kwargs):
    """One request as a server runs it: Django's handler calls close_old_connections when a
    request starts and ends (the test client leaves that out), which drops a connection that
    failed and health-checks a reused one (CONN_HEALTH_CHECKS)."""
    close_old_connections()
    try:
        return send(*args, **kwargs)
    finally:
        close_old_connections()


def terminate(pid: int) -> None:
    with other_session() as other:
        other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def killed_before(table: str):
    """An execute wrapper: the connection's backend is terminated just before the first
    INSERT into ``table``, which then fails as a dead primary's would."""
    done = []

    def wrapper(execute, sql, params, many, context):
        if not done and sql.lstrip().upper().startswith(f'INSERT INTO "{table.upper()}"'.upper()):
            done.append(sql)
            with context["connection"].cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                terminate(cur.fetchone()[0])
        return execute(sql, params, many, context)

    wrapper.done = done
    return wrapper


@pytest.mark.django_db(transaction=True)
def test_a_connection_lost_mid_create_is_a_503_then_the_retry_with_the_key_makes_one_payment(user, api):
    source, target = funded_account(owner=user, balance=100), funded_account()
    body = payment_body(source, target, amount=7)
    before = scrape()
    wrapper = killed_before("payments_scheduledpayment")
    with connection.execute_wrapper(wrapper):
        response = request(post, api, URL, body, key="k-lost")
    assert wrapper.done, "the create never reached its INSERT"
    error = assert_error(response, 503, "database_unavailable")
    assert int(response["Retry-After"]) == error["retry_after"] >= 1
    assert ScheduledPayment.objects.count() == 0 and not IdempotencyKey.objects.exists()  # nothing half written
    assert delta(scrape(), before, "delaypay_api_database_unavailable_total") == 1
    # The same process, the next request: a new connection, and the retry creates it once.
    retried = request(post, api, URL, body, key="k-lost")
    assert retried.status_code == 201, retried.content
    replayed = request(post, api, URL, body, key="k-lost")
    assert replayed.status_code == 201 and replayed["Idempotent-Replayed"] == "true"
    assert ScheduledPayment.objects.count() == 1
    source.refresh_from_db()
    assert source.balance == 100  # scheduled, not yet moved


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_died_between_requests_is_replaced_before_the_request_uses_it(user, api):
    """A primary restarted while the process was idle: the health check at the start of
    the request sees the dead connection and opens another (CONN_HEALTH_CHECKS)."""
    source, target = funded_account(owner=user, balance=100), funded_account()
    assert request(api.get, "/api/v1/accounts").status_code == 200
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        terminate(cur.fetchone()[0])
    response = request(post, api, URL, payment_body(source, target, amount=3), key="k-idle")
    assert response.status_code == 201, response.content
