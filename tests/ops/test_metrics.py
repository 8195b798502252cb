"""GET /metrics: counters, histograms and gauges after a scripted life of payments."""

import os
import socket
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import Histogram

from payments import metrics, reconciliation, tasks
from payments.models import Heartbeat, ScheduledPayment
from payments.services import heartbeat_record, payment_cancel
from tests.conftest import flush_test_redis
from tests.factories import due_payment, expire_lease, funded_account, future_payment, parked_payment

from .scrape import delta, scrape, series_key


def gauge(samples: dict[str, float], name: str, **labels) -> float:
    return samples[series_key(name, labels)]


@pytest.fixture
def fresh_counts(settings):
    """Counts per status straight from the table (no cache) for exact assertions."""
    settings.DELAYPAY_METRICS_CACHE_SECONDS = 0


@pytest.mark.django_db(transaction=True)
def test_schedule_claim_execute_fail_and_lease_expiry_show_in_metrics(fresh_counts):
    flush_test_redis()
    rich, poor, target = funded_account(balance=100), funded_account(balance=0), funded_account()
    ok = due_payment(source=rich, target=target, amount=10, seconds_ago=120)
    underfunded = due_payment(source=poor, target=target, amount=10, seconds_ago=30)
    lease_lost = due_payment(source=rich, target=target, amount=5, seconds_ago=30)
    ScheduledPayment.objects.create(
        payer=rich.owner, from_account=rich, to_account=target, amount=1,
        execute_at=timezone.now() + timedelta(hours=1),
    )
    before = scrape()

    # Scheduled: three overdue, the oldest two minutes late; nothing claimed yet.
    assert 120 <= gauge(before, "delaypay_due_oldest_age_seconds") < 180
    assert gauge(before, "delaypay_overdue") == 3
    assert gauge(before, "delaypay_payments", status="SCHEDULED") == 4
    assert gauge(before, "delaypay_in_flight") == 0

    # Claim: one tick claims the three due payments and publishes one message.
    assert tasks.promoter_tick() == {"claimed": 3, "reclaimed": 0}
    claimed = scrape()
    assert delta(claimed, before, "delaypay_claimed_total") == 3
    assert delta(claimed, before, "delaypay_reclaimed_total") == 0
    assert delta(claimed, before, "delaypay_dispatch_lateness_seconds_count") == 3
    assert delta(claimed, before, "delaypay_dispatch_lateness_seconds_sum") >= 120 + 30 + 30
    # The 120 s payment lands above the 60 s bucket, the others in it.
    assert delta(claimed, before, "delaypay_dispatch_lateness_seconds_bucket", le="60.0") == 2
    assert delta(claimed, before, "delaypay_promoter_tick_seconds_count") == 1
    assert gauge(claimed, "delaypay_in_flight") == 3
    assert gauge(claimed, "delaypay_due_oldest_age_seconds") == 0
    assert gauge(claimed, "delaypay_payments", status="EXECUTING") == 3
    assert gauge(claimed, "delaypay_queue_length", queue="execute") == 1
    assert gauge(claimed, "delaypay_queue_length", queue="promoter") == 0
    assert gauge(claimed, "delaypay_promoter_last_tick_age_seconds") < 60

    # Execute and fail: a worker applies two of them.
    tasks.execute_batch([[ok.id, 1], [underfunded.id, 1]])
    executed = scrape()
    assert delta(executed, claimed, "delaypay_executed_total", outcome="executed", reason="") == 1
    assert delta(executed, claimed, "delaypay_executed_total", outcome="failed", reason="insufficient_funds") == 1
    assert delta(executed, claimed, "delaypay_execution_lateness_seconds_count") == 1
    assert delta(executed, claimed, "delaypay_execution_lateness_seconds_sum") >= 120
    assert delta(executed, claimed, "delaypay_batch_apply_seconds_count") == 1
    assert gauge(executed, "delaypay_payments", status="EXECUTED") == 1
    assert gauge(executed, "delaypay_payments", status="FAILED") == 1

    # Lease expiry: the third payment's worker vanished; the next tick re-claims it.
    expire_lease(lease_lost)
    expired = scrape()
    assert gauge(expired, "delaypay_leases_expired") == 1
    assert gauge(expired, "delaypay_in_flight") == 0
    assert tasks.promoter_tick() == {"claimed": 1, "reclaimed": 1}
    reclaimed = scrape()
    assert delta(reclaimed, expired, "delaypay_claimed_total") == 1
    assert delta(reclaimed, expired, "delaypay_reclaimed_total") == 1
    assert delta(reclaimed, expired, "delaypay_dispatch_lateness_seconds_count") == 0  # first claims only
    assert gauge(reclaimed, "delaypay_leases_expired") == 0

    # The lost attempt's message turns up late (stale), then the new attempt executes.
    tasks.execute_batch([[lease_lost.id, 1]])
    tasks.execute_batch([[lease_lost.id, 2]])
    after = scrape()
    assert delta(after, reclaimed, "delaypay_executed_total", outcome="stale", reason="") == 1
    assert delta(after, reclaimed, "delaypay_executed_total", outcome="executed", reason="") == 1
    assert delta(after, before, "delaypay_executed_total", outcome="executed", reason="") == 2
    assert gauge(after, "delaypay_payments", status="EXECUTED") == 2
    assert gauge(after, "delaypay_payments", status="EXECUTING") == 0
    assert gauge(after, "delaypay_in_flight") == 0
    assert gauge(after, "delaypay_metrics_source_up", source="database") == 1
    assert gauge(after, "delaypay_metrics_source_up", source="redis") == 1
    flush_test_redis()


@pytest.mark.django_db
def test_counts_per_status_are_cached_between_scrapes(settings):
    settings.DELAYPAY_METRICS_CACHE_SECONDS = 3600
    a, b = funded_account(), funded_account()
    scrape()  # fills the cache
    first = scrape()
    due_payment(source=a, target=b, amount=1)
    # The cached count lags; the lag gauges, read every scrape, do not.
    assert scrape()[series_key("delaypay_payments", {"status": "SCHEDULED"})] == first[
        series_key("delaypay_payments", {"status": "SCHEDULED"})
    ]
    settings.DELAYPAY_METRICS_CACHE_SECONDS = 0
    assert delta(scrape(), first, "delaypay_payments", status="SCHEDULED") == 1


@pytest.mark.django_db
def test_reconcile_hook_exports_the_last_result():
    reconciliation.record_reconcile_result(violations=3)
    samples = scrape()
    assert samples["delaypay_reconcile_violations{}"] == 3
    assert samples["delaypay_reconcile_last_run_timestamp{}"] > 0
    reconciliation.record_reconcile_result(violations=0)
    assert scrape()["delaypay_reconcile_violations{}"] == 0


@pytest.mark.django_db
def test_the_review_queue_shows_its_size_and_oldest_age(settings):
    samples = scrape()
    assert (samples["delaypay_needs_review{}"], samples["delaypay_needs_review_oldest_age_seconds{}"]) == (0, 0)
    a, b = funded_account(balance=10), funded_account()
    older = parked_payment(settings, source=a, target=b)
    parked_payment(settings, source=a, target=b)
    ScheduledPayment.objects.filter(pk=older.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    samples = scrape()
    assert samples["delaypay_needs_review{}"] == 2
    assert 540 <= samples["delaypay_needs_review_oldest_age_seconds{}"] < 660  # the test transaction's now()
    payment_cancel(payment_id=older.pk, actor=a.owner)
    assert scrape()["delaypay_needs_review{}"] == 1


def unreachable_redis_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.mark.django_db
def test_scrape_still_answers_when_redis_is_down(settings):
    heartbeat_record(name=Heartbeat.PROMOTER)
    settings.REDIS_URL = unreachable_redis_url()
    samples = scrape()
    assert samples['delaypay_metrics_source_up{source="redis"}'] == 0
    assert samples['delaypay_metrics_source_up{source="database"}'] == 1
    assert not any(key.startswith("delaypay_queue_length") for key in samples)
    assert "delaypay_due_oldest_age_seconds{}" in samples


@pytest.mark.django_db
def test_metrics_need_the_bearer_token_when_one_is_configured(client, settings):
    settings.DELAYPAY_METRICS_TOKEN = "scrape-me-0123456789"
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert scrape(client, Authorization="Bearer scrape-me-0123456789")["delaypay_in_flight{}"] == 0


def test_metrics_refuse_writes_with_a_json_405(client):
    response = client.post("/metrics")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_observe_many_fills_the_same_buckets_as_observe():
    one = Histogram("delaypay_test_observe_one", "test", buckets=metrics.LATENESS_BUCKETS, registry=None)
    many = Histogram("delaypay_test_observe_many", "test", buckets=metrics.LATENESS_BUCKETS, registry=None)
    values = [0.0, 0.05, 0.051, 1, 1.5, 2, 59.9, 60, 61, 3600, 7200]
    for v in values:
        one.observe(v)
    metrics.observe_many(many, values)

    def buckets(h):
        return {s.labels["le"]: s.value for s in h.collect()[0].samples if s.name.endswith("_bucket")}

    assert buckets(many) == buckets(one)
    assert many._sum.get() == pytest.approx(one._sum.get())


@pytest.mark.django_db
def test_counts_of_a_process_that_exited_stay_in_the_totals():
    before = scrape()
    pid = os.fork()
    if pid == 0:  # the child: count, then vanish without any cleanup
        try:
            metrics.executed_total.labels("executed", "").inc(5)
            metrics.observe_many(metrics.execution_lateness_seconds, [1.0, 2.0])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    assert os.path.exists(os.path.join(directory, f"counter_{pid}.db"))

    after = scrape()  # compacts the dead child's files into the archive
    assert delta(after, before, "delaypay_executed_total", outcome="executed", reason="") == 5
    assert delta(after, before, "delaypay_execution_lateness_seconds_count") == 2
    assert delta(after, before, "delaypay_execution_lateness_seconds_bucket", le="1.0") == 1
    assert not os.path.exists(os.path.join(directory, f"counter_{pid}.db"))
    assert os.path.exists(os.path.join(directory, "counter_archive.db"))
    again = scrape()  # nothing left to fold: the totals stay
    assert delta(again, before, "delaypay_executed_total", outcome="executed", reason="") == 5



@pytest.fixture
def scale_settings(settings):
    """Small numbers for the autoscaling signal: a process applies 0.1 payment/s, fully
    busy; a backlog is drained within 10 s; between 1 and 4 processes."""
    settings.DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS = 60
    settings.DELAYPAY_SCALE_DRAIN_SECONDS = 10
    settings.DELAYPAY_SCALE_PROCESS_RATE = 0.1
    settings.DELAYPAY_SCALE_TARGET_UTILIZATION = 1.0
    settings.DELAYPAY_SCALE_MIN_WORKERS = 1
    settings.DELAYPAY_SCALE_MAX_WORKERS = 4
    return settings


@pytest.mark.django_db
def test_workers_needed_follows_the_due_inflow_and_the_backlog(scale_settings):
    scale_settings.DELAYPAY_CLAIM_BATCH = 10**9  # no batch of this host counts as taken under load
    idle = scrape()
    assert gauge(idle, "delaypay_due_inflow_per_second") == 0
    assert gauge(idle, "delaypay_worker_process_rate") == 0.1  # the configured rate
    assert gauge(idle, "delaypay_workers_needed") == 1  # nothing due: the minimum

    a, b = funded_account(balance=100), funded_account()
    for seconds in (5, 10, 20, 30, 40, 45):  # six within the next minute: 0.1/s, one process
        future_payment(source=a, target=b, minutes=seconds / 60)
    future_payment(source=a, target=b, minutes=60)  # beyond the window
    inflow = scrape()
    assert gauge(inflow, "delaypay_due_inflow_per_second") == pytest.approx(0.1)
    assert gauge(inflow, "delaypay_workers_needed") == 1

    due_payment(source=a, target=b, amount=1, seconds_ago=30)  # one overdue, to drain in 10 s: 0.1/s more
    assert gauge(scrape(), "delaypay_workers_needed") == 2

    lost = due_payment(source=a, target=b, amount=1, seconds_ago=30)
    ScheduledPayment.objects.filter(pk=lost.pk).update(  # claimed, and its worker vanished: backlog too
        status="EXECUTING", attempt=1, claimed_at=timezone.now(), lease_until=timezone.now() - timedelta(hours=1)
    )
    assert gauge(scrape(), "delaypay_leases_expired") == 1
    assert gauge(scrape(), "delaypay_workers_needed") == 3

    for _ in range(10):
        due_payment(source=a, target=b, amount=1, seconds_ago=5)
    assert gauge(scrape(), "delaypay_workers_needed") == 4  # 13 processes' work, bounded by the maximum


@pytest.mark.django_db
def test_the_process_rate_is_measured_from_this_hosts_batches_taken_under_load(scale_settings):
    scale_settings.DELAYPAY_CLAIM_BATCH = 2  # every batch of a payment or more counts as full
    metrics.executed_total.labels("executed", "").inc(40_000)
    metrics.batch_apply_seconds.observe(20.0)  # one batch of 40,000 payments applied in 20 s
    samples = scrape()
    applied = sum(value for key, value in samples.items()
                  if key.startswith("delaypay_executed_total{") and 'outcome="error"' not in key)
    measured = applied / samples["delaypay_batch_apply_seconds_sum{}"]
    assert measured > 1  # the configured 0.1 is not what is used
    assert gauge(samples, "delaypay_worker_process_rate") == pytest.approx(measured)
    assert gauge(samples, "delaypay_workers_needed") == 1  # nothing due
