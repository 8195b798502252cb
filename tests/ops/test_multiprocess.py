"""Multiprocess metrics on the real stack: a `celery worker` (prefork) subprocess and this
test process write their own metric files; one scrape of /metrics sums them, and keeps
the worker's counts after it exits."""

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest
from django.conf import settings

from payments import metrics, promoter, worker
from payments.models import PaymentStatus, ScheduledPayment
from payments.promoter import claim_due, messages_for
from tests.concurrency import wait_until
from tests.factories import due_payment, funded_account

from .scrape import delta, scrape

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def own_count(outcome: str) -> float:
    """What this process alone has counted (its own mmap file)."""
    return metrics.executed_total.labels(outcome, "")._value.get()


def pids_with_files(directory: str) -> set[int]:
    return {int(m.group(1)) for name in os.listdir(directory) if (m := re.match(r"^[a-z_]+_(\d+)\.db$", name))}


def test_a_worker_process_and_this_process_report_through_one_scrape(celery_stack):
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    a, b = funded_account(balance=100), funded_account()
    for_worker = [due_payment(source=a, target=b, amount=1) for _ in range(3)]
    claim = claim_due(batch=10, lease_seconds=60)
    before, own_before = scrape(), own_count("executed")

    celery_stack.start_worker(concurrency=1)
    promoter.publish_messages(messages_for(claim))
    wait_until(
        lambda: ScheduledPayment.objects.filter(
            pk__in=[p.id for p in for_worker], status=PaymentStatus.EXECUTED
        ).count() == 3,
        timeout=60, stack=celery_stack, what="the worker to execute its batch",
    )
    # And one batch applied here, in the test process.
    mine = due_payment(source=a, target=b, amount=1)
    worker.run_batch(claim_due(batch=10, lease_seconds=60).fresh)
    assert ScheduledPayment.objects.get(pk=mine.id).status == PaymentStatus.EXECUTED

    during = scrape()
    assert own_count("executed") - own_before == 1
    assert delta(during, before, "delaypay_executed_total", outcome="executed", reason="") == 4
    assert delta(during, before, "delaypay_batch_apply_seconds_count") == 2
    assert len(pids_with_files(directory) - {os.getpid()}) >= 1  # the worker's child wrote its own

    # The worker's lines are JSON, one per event, with its name and the batch's numbers.
    celery_stack.stop()
    lines = [json.loads(line) for line in celery_stack.log("worker").splitlines() if line.startswith("{")]
    [batch] = [line for line in lines if line["message"] == "batch applied"]
    assert (batch["executed"], batch["payments"]) == (3, 3)
    assert batch["worker"].endswith(f":{batch['pid']}")

    # The worker is gone: its counts are folded into the archive, not lost.
    after = scrape()
    assert delta(after, before, "delaypay_executed_total", outcome="executed", reason="") == 4
    assert batch["pid"] not in pids_with_files(directory)


def test_serve_metrics_serves_this_hosts_process_metrics_without_web():
    # A worker-only host: the command serves the shared directory over HTTP.
    metrics.executed_total.labels("executed", "").inc(0)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "delaypay.settings", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve_metrics", "--address", "127.0.0.1", "--port", "0"],
        cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/metrics)", line).group(1)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert 'delaypay_executed_total{outcome="executed",reason=""}' in body
        assert "delaypay_due_oldest_age_seconds" not in body  # the schedule's gauges are web's
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
