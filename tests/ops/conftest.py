"""Fixtures of the operations tests."""

import importlib
import re

import pytest

from payments import metrics, reconciliation
from payments.models import Heartbeat, RailState
from payments.services import heartbeat_record, heartbeats_record

from .scrape import scrape


@pytest.fixture
def exported(db, settings) -> dict[str, set[str]]:
    """Every series name /metrics exports, with its label names, once everything has
    happened at least once (and with the claim sharded: its per-shard gauge)."""
    settings.DELAYPAY_CLAIM_SHARDS = 2
    # The replica's series exist from the import of their module, which a process makes
    # when it routes reads (DATABASE_REPLICA_URL): not on its own in a test run of this file.
    importlib.import_module("delaypay.replica_metrics")
    heartbeat_record(name=Heartbeat.PROMOTER)
    reconciliation.record_reconcile_result(violations=0)
    for outcome in ("executed", "already_applied", "stale", "error"):
        metrics.executed_total.labels(outcome, "").inc(0)
    metrics.executed_total.labels("failed", "insufficient_funds").inc(0)
    RailState.objects.get_or_create(rail="sandbox")  # the rails' gauges come from their rows
    heartbeats_record(values={Heartbeat.settlement_name("sandbox"): 0,  # a settlement run
                              Heartbeat.settlement_name("sandbox", "amount_mismatch"): 0})
    scrape()  # the first request creates the per-view request metrics
    names: dict[str, set[str]] = {}
    for key in scrape():
        name, _, labels = key.partition("{")
        names.setdefault(name, set()).update(re.findall(r'(\w+)="', labels))
    return names
