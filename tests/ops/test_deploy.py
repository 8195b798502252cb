"""deploy/: the Prometheus alerting rules and the Grafana dashboard match what /metrics exports."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

DEPLOY = Path(settings.BASE_DIR) / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "delaypay.json"

METRIC_RE = re.compile(r"\b((?:delaypay|django_http)_[a-z0-9_]+)\b")
SELECTOR_RE = re.compile(r"\b((?:delaypay|django_http)_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_RE = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
BY_RE = re.compile(r"\bby\s*\(([^)]*)\)")


def rules() -> tuple[list[dict], dict[str, str]]:
    """The alerting rules of every group, and the recording rules' expressions by name."""
    every = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    return [r for r in every if "alert" in r], {r["record"]: r["expr"] for r in every if "record" in r}


def expanded(expr: str, recorded: dict[str, str]) -> str:
    """``expr`` with each recording rule it reads replaced by that rule's expression."""
    for name, definition in recorded.items():
        expr = re.sub(rf"(?<![\w:]){re.escape(name)}(?![\w:])", lambda _m, d=definition: f"({d})", expr)
    return expr


def promtool() -> str | None:
    return shutil.which("promtool") or next(
        (str(p) for p in [Path(sys.executable).parent / "promtool"] if p.exists()), None
    )


def run_promtool(*args) -> subprocess.CompletedProcess:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (make test fetches it from Debian's prometheus package); "
                    "test_alert_rules_reference_exported_metrics still checks the rules")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.processes
def test_alert_rules_pass_promtool_check():
    result = run_promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts, recorded = rules()
    assert f"SUCCESS: {len(alerts) + len(recorded)} rules found" in result.stdout


@pytest.mark.processes
def test_example_prometheus_config_passes_promtool_check():
    result = run_promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.processes
def test_alerts_fire_as_their_unit_tests_expect():
    result = run_promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def check_expressions(expressions: list[str], exported: dict[str, set[str]]) -> None:
    assert expressions
    for expr in expressions:
        used = set(METRIC_RE.findall(expr))
        assert used, f"no delaypay or django metric in {expr!r}"
        missing = used - set(exported)
        assert not missing, f"{expr!r} uses {missing}, which /metrics does not export"
        for metric, matchers in SELECTOR_RE.findall(expr):
            for label in MATCHER_RE.findall(matchers):
                assert label in exported[metric], f"{metric} has no label {label!r} ({expr!r})"
        labels_of_used = set().union(*(exported[m] for m in used))
        for group in BY_RE.findall(expr):
            for label in (part.strip() for part in group.split(",") if part.strip()):
                assert label in labels_of_used, f"by ({label}) matches no label of {used} ({expr!r})"


def test_alert_rules_reference_exported_metrics(exported):
    alerts, recorded = rules()
    for rule in alerts:
        assert rule["alert"].startswith("Delaypay")
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    # An alert that reads a recording rule is checked on what that rule reads; every
    # recording rule is read by an alert, and names one that exists.
    assert all(name.startswith("delaypay:") for name in recorded)
    expressions = [expanded(rule["expr"], recorded) for rule in alerts]
    assert not [e for e in expressions if "delaypay:" in e], "a recording rule that does not exist"
    assert not [name for name in recorded if not any(name in rule["expr"] for rule in alerts)], "unread"
    check_expressions(expressions, exported)
    wanted = {"DelaypayDuePaymentsLate", "DelaypayPromoterNotTicking", "DelaypayLeasesExpiring",
              "DelaypayFailureRateSpike", "DelaypayReconcileViolation", "DelaypayDegradedMode",
              "DelaypayPaymentsNeedReview", "DelaypayRecurringGenerationFailing", "DelaypayWebhooksBehind",
              "DelaypayRailBreakerOpen", "DelaypayPayoutsOutcomeUnknown", "DelaypaySettlementMismatch",
              "DelaypayClaimBehindInflow", "DelaypayApiErrorBudgetBurn", "DelaypayApiErrorBudgetBurnSlow"}
    assert wanted <= {rule["alert"] for rule in alerts}


def test_every_alert_has_a_unit_test():
    alerts = {rule["alert"] for rule in rules()[0]}
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert tested == alerts


def test_dashboard_queries_reference_exported_metrics(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    expressions = [t["expr"] for p in panels for t in p["targets"]]
    check_expressions(expressions, exported)
    # The signals an operator opens it for are all on it.
    for signal in ("delaypay_due_oldest_age_seconds", "delaypay_dispatch_lateness_seconds_bucket",
                   "delaypay_execution_lateness_seconds_bucket", "delaypay_executed_total",
                   "delaypay_promoter_last_tick_age_seconds", "delaypay_queue_length", "delaypay_leases_expired",
                   "delaypay_reconcile_violations"):
        assert any(signal in e for e in expressions), signal
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
