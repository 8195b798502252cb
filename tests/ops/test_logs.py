"""Structured logs: JSON lines, request ids, per-payment outcomes, no secrets."""

import json
import logging
import sys

import pytest

from delaypay.logs import JsonFormatter, TextFormatter, request_id_var
from payments import tasks, worker
from payments.promoter import claim_due
from tests.conftest import flush_test_redis
from tests.factories import PASSWORD, UserFactory, due_payment, expire_lease, funded_account


def record(msg="hello", *, exc=False, **extra) -> logging.LogRecord:
    logger = logging.getLogger("test.logs")
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            exc_info = sys.exc_info()
    return logger.makeRecord("test.logs", logging.INFO, __file__, 1, msg, (), exc_info, extra=extra)


def test_json_lines_carry_the_fields_and_stay_on_one_line():
    line = JsonFormatter().format(record("payment failed", exc=True, payment_id="pay_1", attempt=2, worker="w:1"))
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "payment failed"
    assert data["level"] == "INFO"
    assert data["ts"].endswith("Z")
    assert (data["payment_id"], data["attempt"], data["worker"]) == ("pay_1", 2, "w:1")
    assert "ValueError: boom" in data["exc"]


def test_credentials_in_fields_are_redacted():
    extra = {"password": "hunter2", "api_token": "t0k", "Authorization": "Token abc", "db_password": "pw", "n": 1}
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record(**extra))
        for secret in ("hunter2", "t0k", "Token abc", "pw"):
            assert secret not in line
        assert "[redacted]" in line
    assert json.loads(JsonFormatter().format(record(**extra)))["n"] == 1


def test_celery_context_is_reduced_to_the_task_id_and_name():
    rec = record(data={"id": "t-1", "name": "payments.tasks.execute_batch", "args": "[['pay_1', 1]]" * 500})
    rec.name = "celery.worker.strategy"
    data = json.loads(JsonFormatter().format(rec))
    assert (data["task_id"], data["task_name"]) == ("t-1", "payments.tasks.execute_batch")
    assert "data" not in data
    assert "pay_1" not in json.dumps(data)


def test_text_format_is_human_readable_with_key_values():
    line = TextFormatter().format(record("batch applied", executed=3, worker="w:1"))
    assert "INFO test.logs" in line
    assert line.endswith("batch applied executed=3 worker=w:1")


def test_lines_logged_while_serving_a_request_carry_its_id():
    token = request_id_var.set("req-42")
    try:
        assert json.loads(JsonFormatter().format(record()))["request_id"] == "req-42"
    finally:
        request_id_var.reset(token)
    assert "request_id" not in json.loads(JsonFormatter().format(record()))


def request_lines(caplog):
    return [r for r in caplog.records if r.name == "delaypay.request"]


@pytest.mark.django_db
def test_api_requests_echo_the_clients_request_id_and_log_one_line(api, caplog):
    caplog.set_level(logging.INFO)
    response = api.get("/api/v1/payments/pay_doesnotexist", headers={"X-Request-ID": "client-abc.123"})
    assert response.status_code == 404
    assert response["X-Request-ID"] == "client-abc.123"
    [line] = request_lines(caplog)
    data = json.loads(JsonFormatter().format(line))
    assert data["message"] == "request"
    assert data["request_id"] == "client-abc.123"
    assert (data["method"], data["path"], data["status"]) == ("GET", "/api/v1/payments/pay_doesnotexist", 404)
    assert data["payment_id"] == "pay_doesnotexist"
    assert data["view"] == "payment-detail"
    assert isinstance(data["duration_ms"], float)
    assert isinstance(data["user_id"], int)


@pytest.mark.django_db
@pytest.mark.parametrize("given", [None, "", "has spaces", "x" * 200, "semi;colon"])
def test_a_missing_or_malformed_request_id_is_replaced(api, given):
    headers = {"X-Request-ID": given} if given is not None else {}
    response = api.get("/api/v1/accounts", headers=headers)
    assert response.status_code == 200
    assert len(response["X-Request-ID"]) == 32
    assert response["X-Request-ID"] != given


@pytest.mark.django_db
def test_request_bodies_and_credentials_never_reach_the_logs(client, caplog):
    user = UserFactory()
    caplog.set_level(logging.DEBUG)  # everything the request makes anyone log
    response = client.post(
        "/api/v1/auth/token", {"username": user.username, "password": PASSWORD}, content_type="application/json",
        headers={"Authorization": "Token leaked-token-value"},
    )
    assert response.status_code == 200
    token = response.json()["token"]
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert request_lines(caplog)
    for secret in (PASSWORD, token, "leaked-token-value"):
        assert secret not in text


@pytest.mark.django_db
def test_query_strings_stay_out_of_djangos_own_request_lines(api, caplog):
    caplog.set_level(logging.INFO)
    assert api.get("/api/v1/payments/pay_missing?secret_hint=abc123").status_code == 404
    django_lines = [r for r in caplog.records if r.name == "django.request"]
    assert django_lines
    text = "\n".join(f.format(r) for r in caplog.records for f in (JsonFormatter(), TextFormatter()))
    assert "abc123" not in text
    assert json.loads(JsonFormatter().format(django_lines[0]))["request"] == "GET /api/v1/payments/pay_missing"


@pytest.mark.django_db
def test_ops_probes_log_at_debug_only(client, caplog):
    caplog.set_level(logging.INFO)
    client.get("/healthz")
    assert request_lines(caplog) == []


@pytest.mark.django_db(transaction=True)
def test_workers_log_each_outcome_with_payment_attempt_worker_and_timing(caplog):
    caplog.set_level(logging.DEBUG, logger="payments")
    rich, poor, target = funded_account(balance=10), funded_account(), funded_account()
    ok = due_payment(source=rich, target=target, amount=5)
    failing = due_payment(source=poor, target=target, amount=5)
    pairs = claim_due(batch=10, lease_seconds=60).fresh
    worker.run_batch([*pairs, (ok.id, 99)], worker="host:1")

    lines = {(r.getMessage(), getattr(r, "payment_id", None)): r for r in caplog.records}
    executed = lines[("payment executed", ok.id)]
    assert (executed.attempt, executed.worker, executed.outcome) == (1, "host:1", "executed")
    assert executed.execution_lateness_s >= 0
    failed = lines[("payment failed", failing.id)]
    assert (failed.attempt, failed.outcome, failed.failure_reason) == (1, "failed", "insufficient_funds")
    stale = lines[("stale attempt changed nothing", ok.id)]
    assert (stale.attempt, stale.outcome) == (99, "stale")
    summary = lines[("batch applied", None)]
    assert (summary.executed, summary.failed, summary.stale, summary.worker) == (1, 1, 1, "host:1")
    assert summary.apply_ms > 0
    json.loads(JsonFormatter().format(summary))


@pytest.mark.django_db(transaction=True)
def test_the_promoter_logs_its_tick_and_each_reclaim(caplog):
    flush_test_redis()
    caplog.set_level(logging.INFO, logger="payments")
    a, b = funded_account(balance=10), funded_account()
    payment = due_payment(source=a, target=b, amount=1)
    claim_due(batch=10, lease_seconds=60)
    expire_lease(payment)
    tasks.promoter_tick()
    flush_test_redis()
    [reclaim] = [r for r in caplog.records if getattr(r, "outcome", None) == "reclaimed"]
    assert (reclaim.payment_id, reclaim.attempt) == (payment.id, 2)
    [tick] = [r for r in caplog.records if r.getMessage() == "promoter tick"]
    assert (tick.claimed, tick.reclaimed, tick.messages) == (1, 1, 1)
    assert tick.tick_ms >= 0
