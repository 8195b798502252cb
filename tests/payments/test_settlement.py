"""Settlement reconciliation against the sandbox gateway (a real process): payouts worked
in-process to EXECUTED (and one declined), then mismatches injected at the gateway or in
our records, each found as exactly its kind."""

import json
import logging
import os
import subprocess  # nosec B404: manage.py run as its own process, as an operator runs it
import sys
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from devtools.processes import database_url
from payments.models import Heartbeat, Payout, ScheduledPayment
from payments.services import heartbeats_record
from payouts.settlement import KINDS, reconcile_settlement, reconcile_settlement_all
from rails.base import SettlementReportUnavailable
from tests.factories import due_payout, funded_account, payee_for, work_payouts
from tests.ops.scrape import scrape

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_rail")]


work = work_payouts


@pytest.fixture
def paid():
    """Three payouts EXECUTED and one declined; returns (the executed ids, their UTC day)."""
    source = funded_account(balance=1_000)
    payee = payee_for(source.owner)
    executed = [due_payout(source=source, payee=payee, amount=amount).id for amount in (100, 120, 130)]
    declined = due_payout(source=source, payee=payee_for(source.owner, destination="decline-x"), amount=50)
    result = work()
    assert sorted(result.executed) == sorted(executed)
    assert result.failed == {declined.id: "declined"}
    days = {p.paid_at.astimezone(UTC).date() for p in Payout.objects.filter(pk__in=executed)}
    assert len(days) == 1
    return executed, days.pop()


def mismatches() -> dict[str, float]:
    """``delaypay_settlement_mismatches`` of the sandbox rail on /metrics, by kind."""
    prefix = 'delaypay_settlement_mismatches{kind="'
    return {
        key[len(prefix):].split('"', 1)[0]: value for key, value in scrape().items()
        if key.startswith(prefix) and key.endswith(',rail="sandbox"}')
    }


def gauge(kind: str) -> float:
    return mismatches()[kind]


def only(report, kind: str, count: int = 1):
    """``report`` holds exactly ``count`` mismatches, all of ``kind``."""
    assert {k.kind: k.count for k in report.kinds if k.count} == {kind: count}, report.as_dict()


def test_a_clean_day_matches_every_executed_payout(paid, caplog):
    _executed, day = paid
    with caplog.at_level(logging.INFO, logger="payouts.settlement"):
        report = reconcile_settlement(rail="sandbox", day=day)
    assert report.ok and report.mismatches == 0
    assert (report.rows_at_rail, report.payouts_here, report.matched) == (3, 3, 3)  # the declined one is in neither
    assert [k.kind for k in report.kinds] == list(KINDS)
    assert mismatches() == dict.fromkeys(KINDS, 0)
    assert Heartbeat.objects.get(name="settlement:sandbox").value == 0
    assert [r.levelname for r in caplog.records if r.name == "payouts.settlement"] == ["INFO"]


def test_a_payout_unknown_to_us_is_paid_at_rail_not_executed(paid, rail_gateway, caplog):
    _executed, day = paid
    injected = rail_gateway.inject(kind="unknown_payout", amount=5, destination="acct_x")
    with caplog.at_level(logging.INFO, logger="payouts.settlement"):
        report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "paid_at_rail_not_executed")
    assert report.matched == 3 and report.rows_at_rail == 4
    assert report.get("paid_at_rail_not_executed").samples[0].startswith(f"{injected['idempotency_key']} unknown")
    assert gauge("paid_at_rail_not_executed") == 1 and gauge("amount_mismatch") == 0
    assert Heartbeat.objects.get(name="settlement:sandbox").value == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "paid_at_rail_not_executed: 1" in errors[0]
    assert "acct_x" not in caplog.text  # destinations are never logged


def test_a_payout_still_executing_here_is_paid_at_rail_not_executed_until_looked_up(paid, rail_gateway):
    _executed, day = paid
    source = funded_account(balance=500)
    late = due_payout(source=source, payee=payee_for(source.owner), amount=70)
    rail_gateway.faults(timeout_rate=1.0)  # the rail pays it, its answer is lost
    assert work().unknown == [late.id]
    rail_gateway.faults(timeout_rate=0.0)
    report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "paid_at_rail_not_executed")
    assert report.get("paid_at_rail_not_executed").samples[0].startswith(f"{late.id} EXECUTING (payout pending)")
    assert (report.rows_at_rail, report.payouts_here, report.matched) == (4, 3, 3)
    # The follow-up lookup finds it paid, with the rail's time: the same day, now matched.
    ScheduledPayment.objects.filter(pk=late.pk).update(lease_until=timezone.now() - timedelta(hours=1))
    assert work().executed == [late.id]
    report = reconcile_settlement(rail="sandbox", day=day)
    assert report.ok and report.matched == 4


def test_another_amount_at_the_rail_is_amount_mismatch(paid, rail_gateway):
    executed, day = paid
    rail_gateway.inject(kind="amount", idempotency_key=executed[0], amount=999)
    report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "amount_mismatch")
    assert report.get("amount_mismatch").samples == [f"{executed[0]} rail 999, ours 100"]
    assert report.matched == 2
    assert gauge("amount_mismatch") == 1


def test_a_payout_missing_from_the_report_is_executed_not_at_rail(paid, rail_gateway):
    executed, day = paid
    rail_gateway.inject(kind="remove", idempotency_key=executed[1])
    report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "executed_not_at_rail")
    assert report.get("executed_not_at_rail").samples[0].startswith(f"{executed[1]} ")
    assert (report.rows_at_rail, report.payouts_here, report.matched) == (2, 3, 2)


def test_each_kind_is_recorded_with_the_total_by_one_run(paid, rail_gateway):
    executed, day = paid
    rail_gateway.inject(kind="amount", idempotency_key=executed[0], amount=999)
    rail_gateway.inject(kind="remove", idempotency_key=executed[1])
    reconcile_settlement(rail="sandbox", day=day)
    beats = {hb.name: hb for hb in Heartbeat.objects.filter(name__contains="sandbox")}
    assert {name: hb.value for name, hb in beats.items()} == {
        "settlement:sandbox": 2, **{f"stl:sandbox:{kind}": 0 for kind in KINDS},
        "stl:sandbox:amount_mismatch": 1, "stl:sandbox:executed_not_at_rail": 1,
    }
    assert len({hb.beat_at for hb in beats.values()}) == 1  # one statement: one run
    assert mismatches() == {**dict.fromkeys(KINDS, 0), "amount_mismatch": 1, "executed_not_at_rail": 1}


def test_a_total_its_kinds_do_not_account_for_is_exported_as_unknown():
    """A run recorded with its total only (a release before the kinds were), or kinds left
    from an earlier run: the total is the truth, the rest of it is kind "unknown"."""
    heartbeats_record(values={Heartbeat.settlement_name("sandbox", "amount_mismatch"): 1})
    heartbeats_record(values={Heartbeat.settlement_name("sandbox"): 3})
    assert mismatches() == {**dict.fromkeys(KINDS, 0), "unknown": 3}


def test_no_settlement_run_no_series():
    samples = scrape()
    assert not any(key.startswith("delaypay_settlement_") for key in samples)


def test_heartbeat_names_fit_their_column():
    from rails.base import RAIL_NAMES

    longest = max(len(Heartbeat.settlement_name(rail, kind)) for rail in RAIL_NAMES for kind in KINDS)
    assert longest <= Heartbeat._meta.get_field("name").max_length


@pytest.mark.django_db(transaction=True)
def test_a_mismatch_found_by_a_process_that_exited_stays_on_metrics(paid, rail_gateway):
    """reconcile_settlement run as a process of its own, as an operator or a cron job runs
    it, finds two mismatches and exits 1; /metrics, served by another process (this one),
    still exports them, with the time of the run."""
    executed, day = paid
    rail_gateway.inject(kind="remove", idempotency_key=executed[0])
    rail_gateway.inject(kind="amount", idempotency_key=executed[1], amount=999)
    env = {**os.environ, "DATABASE_URL": database_url(), "DELAYPAY_RAIL_SANDBOX_URL": rail_gateway.url}
    done = subprocess.run(  # nosec B603: a fixed command line
        [sys.executable, "manage.py", "reconcile_settlement", "--date", day.isoformat(), "--rail", "sandbox"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sandbox" in done.stdout and "2 mismatches" in done.stdout
    samples = scrape()
    assert mismatches() == {**dict.fromkeys(KINDS, 0), "amount_mismatch": 1, "executed_not_at_rail": 1}
    ran_at = Heartbeat.objects.get(name="settlement:sandbox").beat_at.timestamp()
    assert samples['delaypay_settlement_last_run_timestamp{rail="sandbox"}'] == ran_at


def test_another_destination_is_payee_mismatch_and_never_shown(paid, caplog):
    executed, day = paid
    Payout.objects.filter(pk=executed[2]).update(destination="acct_secret")
    with caplog.at_level(logging.INFO, logger="payouts.settlement"):
        report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "payee_mismatch")
    assert report.get("payee_mismatch").samples[0].startswith(f"{executed[2]} ")
    assert "acct_secret" not in json.dumps(report.as_dict()) and "acct_bob" not in json.dumps(report.as_dict())
    assert "acct_secret" not in caplog.text and "acct_bob" not in caplog.text


def test_another_reference_is_reference_mismatch(paid):
    executed, day = paid
    Payout.objects.filter(pk=executed[0]).update(reference="po_other")
    report = reconcile_settlement(rail="sandbox", day=day)
    only(report, "reference_mismatch")
    assert report.get("reference_mismatch").samples[0].startswith(f"{executed[0]} rail po_")


def test_the_gauge_goes_back_to_zero_on_a_clean_run(paid, rail_gateway):
    executed, day = paid
    rail_gateway.inject(kind="amount", idempotency_key=executed[0], amount=999)
    reconcile_settlement(rail="sandbox", day=day)
    assert gauge("amount_mismatch") == 1
    rail_gateway.inject(kind="amount", idempotency_key=executed[0], amount=100)
    assert reconcile_settlement(rail="sandbox", day=day).ok
    assert gauge("amount_mismatch") == 0
    assert Heartbeat.objects.get(name="settlement:sandbox").value == 0


def test_a_day_without_payouts_is_clean_with_no_rows(paid):
    _executed, day = paid
    report = reconcile_settlement(rail="sandbox", day=day - timedelta(days=3))
    assert report.ok and (report.rows_at_rail, report.payouts_here, report.matched) == (0, 0, 0)


def test_reconcile_all_returns_a_report_per_rail_or_raises(paid, rail_gateway):
    _executed, day = paid
    assert [(r.rail, r.ok) for r in reconcile_settlement_all(day=day)] == [("sandbox", True)]
    rail_gateway.faults(down=True)
    with pytest.raises(SettlementReportUnavailable, match="sandbox"):
        reconcile_settlement_all(day=day)


def run(*args) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("reconcile_settlement", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_the_command_exits_0_clean_1_on_a_mismatch_and_2_when_the_rail_is_down(paid, rail_gateway):
    executed, day = paid
    code, out, _ = run("--date", day.isoformat())
    assert code == 0 and "3 matched" in out and "0 mismatches" in out
    rail_gateway.inject(kind="remove", idempotency_key=executed[0])
    code, out, _ = run("--date", day.isoformat(), "--rail", "sandbox")
    assert code == 1 and "FAIL executed_not_at_rail: 1" in out and executed[0] in out
    rail_gateway.faults(down=True)
    code, out, err = run("--date", day.isoformat())
    assert code == 2 and "sandbox unavailable" in err and out == ""


def test_the_command_json(paid, rail_gateway):
    executed, day = paid
    rail_gateway.inject(kind="amount", idempotency_key=executed[0], amount=999)
    code, out, _ = run("--date", day.isoformat(), "--json")
    assert code == 1
    result = json.loads(out)
    assert set(result) == {"ok", "day", "mismatches", "reports", "unavailable"}
    assert (result["ok"], result["day"], result["mismatches"], result["unavailable"]) == (False, day.isoformat(), 1, {})
    [report] = result["reports"]
    assert set(report) == {"rail", "day", "ok", "mismatches", "rows_at_rail", "payouts_here", "matched", "seconds",
                           "kinds"}
    assert (report["rail"], report["rows_at_rail"], report["payouts_here"], report["matched"]) == ("sandbox", 3, 3, 2)
    assert [k["kind"] for k in report["kinds"]] == list(KINDS)
    amount = report["kinds"][list(KINDS).index("amount_mismatch")]
    assert (amount["count"], amount["ok"], amount["samples"]) == (1, False, [f"{executed[0]} rail 999, ours 100"])
    rail_gateway.faults(down=True)
    code, out, _ = run("--date", day.isoformat(), "--json")
    assert code == 2
    result = json.loads(out)
    assert result["reports"] == [] and list(result["unavailable"]) == ["sandbox"] and result["ok"] is False


def test_the_command_defaults_to_yesterday(rail_gateway):
    code, out, _ = run()
    assert code == 0 and "0 rows at the rail" in out


def test_the_command_refuses_a_bad_date():
    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        call_command("reconcile_settlement", "--date", "yesterday")


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_it_reads_one_read_only_snapshot(paid):
    _executed, day = paid
    report = reconcile_settlement(rail="sandbox", day=day)
    assert report.ok and report.matched == 3
