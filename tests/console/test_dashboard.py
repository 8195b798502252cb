"""The dashboard's second pass: 24 h history charts, tiles that link to exactly what they
count, thresholds, the webhook backlog, thousands separators."""

import re
from datetime import timedelta
from itertools import pairwise
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from console.dashboard import LATENESS_SLOTS, OUTCOME_SLOTS, OVERDUE_ALERT_SECONDS, lateness_path
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.selectors import lateness_history, outcomes_history
from tests.conftest import admin_client_for
from tests.factories import due_payment, funded_account
from webhooks.models import DeliveryStatus

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin-dashboard")


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def finished_payment(source, target, *, kind: str, at, late_seconds: float = 0.0, amount: int = 1):
    """A finished payment with its one final event recorded at ``at`` (written directly:
    the history reads only the event log and the payment's times)."""
    status = {"executed": PaymentStatus.EXECUTED, "failed": PaymentStatus.FAILED,
              "cancelled": PaymentStatus.CANCELLED}[kind]
    payment = ScheduledPayment.objects.create(
        payer=source.owner, from_account=source, to_account=target, amount=amount,
        execute_at=at - timedelta(seconds=late_seconds), status=status, attempt=1,
        executed_at=at if kind == "executed" else None,
        failure_reason="insufficient_funds" if kind == "failed" else "",
        cancelled_at=at if kind == "cancelled" else None,
    )
    data = {"failure_reason": "insufficient_funds"} if kind == "failed" else {}
    PaymentEvent.objects.create(payment=payment, kind=kind, from_status="EXECUTING", to_status=status,
                                actor="test", data=data, created_at=at)
    return payment


@pytest.fixture
def history():
    a, b = funded_account(balance=10**9), funded_account()
    now = db_now()
    rows = {
        "executed_now": [finished_payment(a, b, kind="executed", at=now, late_seconds=s) for s in (1, 2, 3)],
        "executed_3h": [finished_payment(a, b, kind="executed", at=now - timedelta(hours=3), late_seconds=40)],
        "failed_3h": [finished_payment(a, b, kind="failed", at=now - timedelta(hours=3))],
        "cancelled_2h": [finished_payment(a, b, kind="cancelled", at=now - timedelta(hours=2))],
        # Outside the window: never counted.
        "executed_2d": [finished_payment(a, b, kind="executed", at=now - timedelta(days=2), late_seconds=900)],
    }
    return rows


def svg_of(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start:html.index("</svg>", start)]


# --- the selectors -------------------------------------------------------------------------


def test_outcomes_history_counts_each_kind_in_its_slot_over_24_hours_only(history):
    slots = outcomes_history(bucket_seconds=600, slots=144)
    assert len(slots) == 144
    assert slots[-1].start <= db_now() < slots[-1].start + timedelta(minutes=10)
    assert all(b.start - a.start == timedelta(minutes=10) for a, b in pairwise(slots))
    assert (slots[-1].executed, slots[-1].failed, slots[-1].cancelled) == (3, 0, 0)
    assert sum(s.executed for s in slots) == 4  # the one two days ago is outside the window
    assert sum(s.failed for s in slots) == 1 and sum(s.cancelled for s in slots) == 1


def test_lateness_history_gives_p50_and_p99_per_minute(history):
    slots = lateness_history(bucket_seconds=60, slots=1440)
    assert len(slots) == 1440
    last = slots[-1]
    assert last.executed == 3
    assert last.p50_seconds == pytest.approx(2.0)
    assert 2.9 < last.p99_seconds <= 3.0
    with_data = [s for s in slots if s.executed]
    assert [s.executed for s in with_data] == [1, 3]
    assert with_data[0].p50_seconds == pytest.approx(40.0)
    assert sum(1 for s in slots if s.p50_seconds is None) == 1438


def test_lateness_path_breaks_at_minutes_without_executions():
    path = lateness_path([1.0, None, 2.0, 2.0], slot_width=10, ceiling=2.0)
    assert path.count("M") == 2  # two runs: [0] and [2, 3]
    assert path == "M0 72.0 h10 M20 4.0 L30 4.0"
    assert lateness_path([None, None], slot_width=10, ceiling=1.0) == ""


# --- the page ----------------------------------------------------------------------------------


def test_dashboard_draws_the_24_hour_charts_as_server_side_svg(auditor_user, history):
    response = admin_client_for(auditor_user).get(DASHBOARD)
    assert response.status_code == 200
    ctx = response.context
    assert len(ctx["outcome_chart"].bars) == OUTCOME_SLOTS
    assert ctx["outcome_chart"].totals == {"executed": 4, "failed": 1, "cancelled": 1}
    assert ctx["lateness_chart"].points == 2
    assert ctx["lateness_chart"].worst_p99_seconds == pytest.approx(40.0)
    html = response.content.decode()
    outcomes = svg_of(html, "dp-outcome-chart")
    assert len(re.findall(r'<rect class="dp-executed"', outcomes)) == 2  # two slots with executions
    assert len(re.findall(r'<rect class="dp-failed"', outcomes)) == 1
    assert len(re.findall(r'<rect class="dp-cancelled"', outcomes)) == 1
    lateness = svg_of(html, "dp-lateness-chart")
    assert '<path class="dp-p50" d="M' in lateness and '<path class="dp-p99" d="M' in lateness
    for svg in (outcomes, lateness):
        assert "<script" not in svg and "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert LATENESS_SLOTS == 1440


def test_dashboard_renders_with_an_empty_database(auditor_user):
    response = admin_client_for(auditor_user).get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert "nothing executed" in html
    assert 'class="dp-p50"' not in html


def query_of(url: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


def listed(client, url) -> set[str]:
    response = client.get(url)
    assert response.status_code == 200, url
    return {str(obj.pk) for obj in response.context["cl"].result_list}


def test_last_hour_tiles_link_to_exactly_the_events_they_count(superuser, history):
    a, b = funded_account(balance=10), funded_account()
    old = finished_payment(a, b, kind="executed", at=db_now() - timedelta(minutes=61))  # just outside the hour
    client = admin_client_for(superuser)
    response = client.get(DASHBOARD)
    links, outcomes = response.context["links"], response.context["outcomes"]
    assert outcomes.executed == 3 and outcomes.failed_total == 0
    executed = listed(client, links["executed"])
    assert executed == {str(e.pk) for e in PaymentEvent.objects.filter(
        kind="executed", payment__in=history["executed_now"])}
    assert not PaymentEvent.objects.filter(payment=old, pk__in=executed).exists()
    q = query_of(links["executed"])
    assert q["kind__exact"] == "executed" and "created_at__gte" in q and "created_at__lte" in q
    assert listed(client, links["failed"]) == set()
    html = response.content.decode()
    assert f'href="{links["executed"].replace("&", "&amp;")}"' in html


def counts_of(response) -> dict[str, int]:
    """The status table's counts: status -> payments."""
    return {status: n for status, n, _ in response.context["counts"]}


def test_failed_by_reason_tile_links_to_those_failures(superuser):
    a, b = funded_account(balance=10), funded_account()
    failed = finished_payment(a, b, kind="failed", at=db_now())
    client = admin_client_for(superuser)
    response = client.get(DASHBOARD)
    [(reason, n, url, said)] = response.context["failed_by_reason"]
    assert (reason, n) == ("insufficient_funds", 1)
    assert said.startswith("Insufficient funds: ") and said.endswith("(insufficient_funds)")
    assert listed(client, url) == {str(e.pk) for e in PaymentEvent.objects.filter(payment=failed, kind="failed")}
    assert response.context["failed_alert"]  # 1 of 1 failed: above the share that is normal


def test_overdue_tiles_turn_red_only_past_the_threshold(auditor_user):
    a, b = funded_account(balance=100), funded_account()
    client = admin_client_for(auditor_user)
    due_payment(source=a, target=b, amount=1, seconds_ago=5)  # a few seconds: the normal state
    response = client.get(DASHBOARD)
    assert response.context["health"].overdue == 1 and not response.context["overdue_alert"]
    html = response.content.decode()
    assert 'class="dp-tile" href="' in html and 'id="dp-oldest-due"' in html
    assert re.search(r'class="dp-tile" href="[^"]*" id="dp-oldest-due"', html)
    due_payment(source=a, target=b, amount=1, seconds_ago=OVERDUE_ALERT_SECONDS + 30)
    response = client.get(DASHBOARD)
    assert response.context["overdue_alert"]
    assert re.search(r'class="dp-tile dp-alert" href="[^"]*" id="dp-oldest-due"', response.content.decode())


def test_overdue_and_in_flight_tiles_link_to_the_rows_they_count(superuser):
    a, b = funded_account(balance=100), funded_account()
    overdue = due_payment(source=a, target=b, amount=1, seconds_ago=120)
    retry_waiting = due_payment(source=a, target=b, amount=1, seconds_ago=120)
    ScheduledPayment.objects.filter(pk=retry_waiting.pk).update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    client = admin_client_for(superuser)
    response = client.get(DASHBOARD)
    assert response.context["health"].overdue == 1
    links = response.context["links"]
    assert listed(client, links["overdue"]) == {overdue.pk}  # not the retry waiting on its ladder
    assert listed(client, links["in_flight"]) == set()
    assert listed(client, links["needs_review"]) == set()


def test_webhook_backlog_tiles(superuser):
    client = admin_client_for(superuser)
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="dp-webhook-deliveries"' in html and 'id="dp-webhook-events"' in html
    links = response.context["links"]
    assert query_of(links["webhook_deliveries"]) == {"status__exact": DeliveryStatus.PENDING}
    assert query_of(links["webhook_events"]) == {"fanned_out_at__isnull": "True"}
    for key in ("webhook_deliveries", "webhook_events"):
        assert client.get(links[key]).status_code == 200
    assert not response.context["webhook_alert"]


def test_amounts_and_counts_have_thousands_separators(auditor_user):
    a, b = funded_account(balance=10**9), funded_account()
    now = db_now()
    ScheduledPayment.objects.bulk_create([
        ScheduledPayment(payer=a.owner, from_account=a, to_account=b, amount=1, execute_at=now + timedelta(days=2))
        for _ in range(1200)
    ])
    html = admin_client_for(auditor_user).get(DASHBOARD).content.decode()
    assert "1,200" in html


def test_history_is_read_at_most_once_a_minute_and_redis_down_is_not_an_error(auditor_user, history, monkeypatch):
    from django.core.cache import cache
    from redis.exceptions import ConnectionError as RedisConnectionError

    from console import dashboard

    first = dashboard.history_charts()
    calls = []
    monkeypatch.setattr(dashboard, "outcomes_history", lambda **kw: calls.append(kw) or [])
    assert dashboard.history_charts() == first and not calls  # from the cache

    def down(*args, **kwargs):
        raise RedisConnectionError("redis is down")

    monkeypatch.undo()
    monkeypatch.setattr(cache, "get", down)
    monkeypatch.setattr(cache, "set", down)
    response = admin_client_for(auditor_user).get(DASHBOARD)
    assert response.status_code == 200
    assert response.context["outcome_chart"].totals["executed"] == 4


def test_counts_by_status_are_read_at_most_once_a_minute_and_say_when(superuser):
    """The counts scan every row: one reading serves the page for a minute (the health
    tiles stay live); the page says when they were counted."""
    from django.core.cache import cache

    source, target = funded_account(balance=100), funded_account()
    due_payment(source=source, target=target, amount=1, seconds_ago=-600)
    client = admin_client_for(superuser)
    first = client.get(DASHBOARD)
    assert counts_of(first)[PaymentStatus.SCHEDULED] == 1
    assert "counted at" in first.content.decode()
    due_payment(source=source, target=target, amount=1, seconds_ago=-600)
    assert counts_of(client.get(DASHBOARD))[PaymentStatus.SCHEDULED] == 1  # the minute's reading
    cache.clear()
    assert counts_of(client.get(DASHBOARD))[PaymentStatus.SCHEDULED] == 2


# --- the Processes panel (issue 36, point 2) ------------------------------------------------


def beats_aged(**ages_seconds):
    """Heartbeats of these names written ``ages_seconds`` ago on the database clock."""
    from django.db.models.functions import Now

    from payments.models import Heartbeat
    from payments.services import heartbeats_record

    heartbeats_record(values=dict.fromkeys(ages_seconds, 0))
    for name, age in ages_seconds.items():
        Heartbeat.objects.filter(name=name).update(beat_at=Now() - timedelta(seconds=age))


def processes_of(response) -> dict:
    return {row.process: row for row in response.context["processes"]}


def test_the_processes_panel_says_which_process_types_are_alive_stale_or_missing(auditor_user, settings):
    client = admin_client_for(auditor_user)
    rows = processes_of(client.get(DASHBOARD))
    assert list(rows) == ["promoter", "worker", "payouts", "webhooks", "beat"]
    assert {row.state for row in rows.values()} == {"missing"}  # nothing ever beat: all red
    assert {row.tone for row in rows.values()} == {"red"}

    beats_aged(**{"promoter": 1, "process:worker": 5, "process:payouts": 300})
    response = client.get(DASHBOARD)
    rows = processes_of(response)
    assert (rows["promoter"].state, rows["promoter"].tone, rows["promoter"].age) == ("alive", "green", "1 s ago")
    assert (rows["worker"].state, rows["worker"].age) == ("alive", "5 s ago")
    assert (rows["payouts"].state, rows["payouts"].tone, rows["payouts"].age) == ("stale", "red", "5 min 0 s ago")
    assert (rows["webhooks"].state, rows["webhooks"].age) == ("missing", "never")
    assert (rows["beat"].state, rows["beat"].age) == ("alive", "5 s ago")  # the newest heartbeat it sent
    assert isinstance(rows["worker"].waiting, int) and rows["worker"].queue == "execute"
    html = response.content.decode()
    assert 'id="dp-processes"' in html
    assert html.index('id="dp-processes"') < html.index('id="dp-oldest-due"')  # first on the page
    assert 'id="dp-process-webhooks" class="dp-process-missing"' in html
    assert 'id="dp-process-payouts" class="dp-process-stale"' in html

    # A promoter tick older than readiness allows is stale; beat stale when all it sends are.
    beats_aged(**{"promoter": settings.DELAYPAY_READY_MAX_TICK_AGE_SECONDS + 5, "process:worker": 120})
    rows = processes_of(client.get(DASHBOARD))
    assert rows["promoter"].state == "stale" and rows["beat"].state == "stale"


def test_the_processes_panel_lists_claim_shards_and_survives_redis_down(auditor_user, settings, monkeypatch):
    settings.DELAYPAY_CLAIM_SHARDS = 2
    beats_aged(**{"promoter:shard:0": 1})
    monkeypatch.setattr("console.dashboard.broker.probe_client", lambda: (_ for _ in ()).throw(ConnectionError()))
    response = admin_client_for(auditor_user).get(DASHBOARD)
    rows = processes_of(response)
    assert rows["promoter, claim shard 0"].state == "alive" and rows["promoter, claim shard 1"].state == "missing"
    assert rows["worker"].waiting is None
    assert "unknown (Redis did not answer)" in response.content.decode()


def test_beat_sends_each_process_type_its_heartbeat_and_the_task_records_it():
    from django.conf import settings as django_settings

    from payments.models import Heartbeat
    from payments.tasks import process_heartbeat

    schedule = django_settings.CELERY_BEAT_SCHEDULE
    assert {name: (entry["args"], entry["options"]["queue"]) for name, entry in schedule.items()
            if entry["task"] == "payments.tasks.process_heartbeat"} == {
        "heartbeat-worker": (["worker"], "execute"),
        "heartbeat-payouts": (["payouts"], "payouts"),
        "heartbeat-webhooks": (["webhooks"], "webhooks"),
    }
    process_heartbeat("payouts")
    assert Heartbeat.objects.filter(name="process:payouts").exists()


def test_the_lag_tiles_name_an_open_rail_breaker_when_its_payouts_are_the_cause(auditor_user):
    from payments.models import BreakerState, RailState
    from tests.factories import payee_for

    source = funded_account(balance=100)
    payee = payee_for(source.owner)
    now = timezone.now()
    common = {"payer": source.owner, "from_account": source, "to_payee": payee, "rail": payee.rail, "amount": 1}
    ScheduledPayment.objects.create(**common, execute_at=now - timedelta(minutes=5))
    ScheduledPayment.objects.create(**common, execute_at=now - timedelta(minutes=5), status=PaymentStatus.EXECUTING,
                                    attempt=1, claimed_at=now - timedelta(minutes=4),
                                    lease_until=now - timedelta(minutes=3))
    due_payment(source=source, target=funded_account(), amount=1, seconds_ago=300)  # overdue, not a payout
    client = admin_client_for(auditor_user)
    closed = client.get(DASHBOARD)
    assert closed.context["overdue_causes"] == [] and "dp-overdue-cause" not in closed.content.decode()

    RailState.objects.filter(rail=payee.rail).update(breaker=BreakerState.OPEN, opened_at=now)
    response = client.get(DASHBOARD)
    html = response.content.decode()
    assert response.context["health"].overdue == 2
    (overdue,) = response.context["overdue_causes"]
    (lease,) = response.context["lease_causes"]
    assert (overdue.rail, overdue.overdue, lease.leases_expired) == (payee.rail, 1, 1)
    for cause in (f'id="dp-overdue-cause-{payee.rail}"', f'id="dp-lease-cause-{payee.rail}"'):
        assert cause in html
    assert f'href="#dp-rail-{payee.rail}"' in html and f'id="dp-rail-{payee.rail}"' in html


def test_the_on_time_tile_shows_the_p99_lateness_of_the_last_five_minutes_and_links_to_them(superuser):
    a, b = funded_account(balance=10**9), funded_account()
    now = db_now()
    on_time = [finished_payment(a, b, kind="executed", at=now - timedelta(seconds=i), late_seconds=0.012)
               for i in range(99)]
    finished_payment(a, b, kind="executed", at=now - timedelta(seconds=100), late_seconds=0.4)
    finished_payment(a, b, kind="executed", at=now - timedelta(minutes=6), late_seconds=30)  # outside the window
    client = admin_client_for(superuser)
    response = client.get(DASHBOARD)
    lateness = response.context["lateness"]
    assert lateness.executed == 100
    assert lateness.p50_seconds == pytest.approx(0.012)
    assert 0.012 < lateness.p99_seconds < 0.4 and lateness.max_seconds == pytest.approx(0.4)
    html = response.content.decode()
    tile = html[html.index('id="dp-on-time"'):]
    tile = tile[:tile.index("</a>")]
    assert "dp-alert" not in html[html.index('class="dp-tile', html.index('id="dp-on-time"') - 60):
                                  html.index('id="dp-on-time"')]
    assert "p99 lateness, last 5 minutes (p50 12 ms, 100 executed)" in tile
    link = response.context["links"]["on_time"]
    q = query_of(link)
    assert q["kind__exact"] == "executed"
    counted = PaymentEvent.objects.filter(kind="executed", created_at__gte=q["created_at__gte"],
                                          created_at__lte=q["created_at__lte"])
    assert counted.count() == 100 and {p.pk for p in on_time} <= set(counted.values_list("payment_id", flat=True))
    assert client.get(link).context["cl"].result_count == 100


def test_the_on_time_tile_turns_red_above_the_slo(auditor_user):
    a, b = funded_account(balance=10**9), funded_account()
    now = db_now()
    for i in range(10):
        finished_payment(a, b, kind="executed", at=now - timedelta(seconds=i), late_seconds=0.9)
    html = admin_client_for(auditor_user).get(DASHBOARD).content.decode()
    start = html.rindex("<a", 0, html.index('id="dp-on-time"'))
    assert "dp-alert" in html[start:html.index('id="dp-on-time"')]
    assert ">900 ms<" in html
