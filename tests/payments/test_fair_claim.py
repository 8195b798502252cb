"""Per-sender fairness of the internal claim (issue 17; sql.CLAIM_DUE_FAIR, promoter.FairWalk).

One sender with thousands of payments due at the same instant as a few of everyone
else's must not hold those behind all of its own: with DELAYPAY_CLAIM_PER_SENDER on,
the others' payments are in the first claims of the tick, and the hot sender still
drains at the full batch once nobody else is waiting.
"""

import subprocess  # nosec B404: only for the CompletedProcess type
from functools import partial

import pytest
from django.db import connection
from django.db.models import Count

from payments import promoter, sql
from payments.models import PaymentEvent, PaymentStatus, ScheduledPayment
from payments.promoter import FAIR_WALK_BATCHES, FairWalk, claim_and_publish, claim_due, claim_params
from tests.concurrency import Racers
from tests.factories import funded_account
from tests.payments.test_execution_plans import plan_nodes
from tests.settings_child import settings_in_child

BATCH = 100
CAP = 20


@pytest.fixture(autouse=True)
def _no_carried_walk():
    """A tick cut short hands its walk to the next tick of the same thread: not across tests."""
    promoter._carried.walks = {}
    yield
    promoter._carried.walks = {}


def load_due(rows: list[tuple[str, str]], *, target) -> None:
    """Due SCHEDULED internal payments ``(id, from_account_id)``, all at the same instant
    (ten seconds ago), each with its created event. Same instant: their due order is by id."""
    ids, senders = zip(*rows, strict=True)
    with connection.cursor() as cur:
        cur.execute(
            """
            WITH p AS (
                INSERT INTO payments_scheduledpayment
                       (id, payer_id, from_account_id, to_account_id, amount, execute_at, status,
                        failure_reason, attempt, version, created_at, updated_at)
                SELECT v.id, a.owner_id, v.sender, %(target)s, 1, date_trunc('second', now()) - interval '10 seconds',
                       'SCHEDULED', '', 0, 1, now(), now()
                  FROM unnest(%(ids)s::text[], %(senders)s::text[]) AS v(id, sender)
                  JOIN ledger_account a ON a.id = v.sender
             RETURNING id
            )
            INSERT INTO payments_paymentevent
                   (payment_id, kind, from_status, to_status, attempt, actor, data, created_at)
            SELECT id, 'created', '', 'SCHEDULED', 0, 'test', '{}'::jsonb, now() FROM p
            """,
            {"ids": list(ids), "senders": list(senders), "target": target.id},
        )


def hot_and_others(*, hot: int, others: int, others_every: int | None = None):
    """One hot sender with ``hot`` due payments and ``others`` senders with one each. The
    others' payments come every ``others_every``-th in due order (None: after all of the
    hot sender's, the worst case for them)."""
    target = funded_account()
    hot_sender = funded_account()
    other_senders = [funded_account() for _ in range(others)]
    total = hot + others
    if others_every is None:
        positions = set(range(hot + 1, total + 1))
    else:
        positions = {others_every * (k + 1) for k in range(others)}
        assert max(positions) <= total
    others_iter = iter(other_senders)
    rows, other_ids = [], set()
    for position in range(1, total + 1):
        payment_id = f"pay_fair{position:08d}"
        if position in positions:
            rows.append((payment_id, next(others_iter).id))
            other_ids.add(payment_id)
        else:
            rows.append((payment_id, hot_sender.id))
    load_due(rows, target=target)
    return hot_sender, other_ids


def drain_fair(*, batch: int, cap: int) -> list[list[tuple[str, int]]]:
    """Claim as one promoter's tick does with fairness on, until its walk says nothing is left."""
    fair = FairWalk(cap=cap)
    claims = []
    while True:
        claim = claim_due(batch=batch, lease_seconds=60, fair=fair)
        claims.append(claim.fresh + claim.reclaimed)
        if not claim and not fair.more:
            return claims


@pytest.mark.django_db
def test_the_first_claim_of_a_tick_holds_every_other_senders_payment(settings):
    settings.DELAYPAY_CLAIM_PER_SENDER = CAP
    _, others = hot_and_others(hot=1500, others=50, others_every=31)
    published = []
    claim_and_publish(publish=published.extend, execute_in_process=None, batch=BATCH, budget_seconds=60)
    first = {payment_id for payment_id, _ in published[0]}
    assert others <= first
    # The rest of the first claim is the hot sender's (the others left it room), and
    # every other claim of the tick is full: the cap takes nothing from the drain.
    assert len(first) == BATCH
    assert [len(m) for m in published[:-1]] == [BATCH] * (len(published) - 1)
    assert sum(len(m) for m in published) == 1550
    assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()


@pytest.mark.django_db
def test_with_the_cap_off_the_claim_keeps_plain_due_order(settings):
    settings.DELAYPAY_CLAIM_PER_SENDER = 0
    _, others = hot_and_others(hot=1500, others=50, others_every=31)
    published = []
    claim_and_publish(publish=published.extend, execute_in_process=None, batch=BATCH, budget_seconds=60)
    assert [pid for pid, _ in published[0]] == [f"pay_fair{n:08d}" for n in range(1, BATCH + 1)]
    assert len(others & {pid for pid, _ in published[0]}) == 3  # positions 31, 62, 93


@pytest.mark.django_db
def test_a_hot_sender_ahead_of_everyone_delays_the_others_by_one_claim():
    _, others = hot_and_others(hot=2000, others=50)  # every other payment after the hot ones
    claims = drain_fair(batch=BATCH, cap=CAP)
    # The first claim's walk (20 batches) sees only the hot sender's rows: it takes a full
    # batch of them and moves its cursor past them; the second claim has all the others.
    assert not others & {pid for pid, _ in claims[0]}
    assert others <= {pid for pid, _ in claims[1]}
    assert len(claims[1]) == BATCH
    # Plain due order would have reached them in the 21st claim.


@pytest.mark.django_db
def test_a_hot_sender_still_drains_fully_each_claim_fenced_and_audited():
    hot_sender, _ = hot_and_others(hot=1000, others=30, others_every=17)
    claims = drain_fair(batch=BATCH, cap=CAP)
    taken = [pair for claim in claims for pair in claim]
    assert len(taken) == len({pid for pid, _ in taken}) == 1030
    assert {attempt for _, attempt in taken} == {1}
    sizes = [len(c) for c in claims if c]
    assert sizes == [BATCH] * 10 + [30]
    assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()
    rows = ScheduledPayment.objects.filter(from_account=hot_sender)
    assert rows.filter(status=PaymentStatus.EXECUTING, attempt=1, lease_until__isnull=False).count() == 1000
    assert ScheduledPayment.objects.filter(attempt=1, claimed_at__isnull=False).count() == 1030
    assert not PaymentEvent.objects.filter(kind__in=["claimed", "reclaimed"]).exists()  # none claimed twice


@pytest.mark.django_db
def test_several_hot_senders_each_get_the_cap_and_the_others_the_rest():
    target = funded_account()
    hot = [funded_account() for _ in range(2)]
    others = [funded_account() for _ in range(30)]
    rows = [(f"pay_fair{n:08d}", hot[n % 2].id) for n in range(600)]
    rows += [(f"pay_fair{600 + n:08d}", account.id) for n, account in enumerate(others)]
    load_due(rows, target=target)
    fair = FairWalk(cap=CAP)
    claim = claim_due(batch=BATCH, lease_seconds=60, fair=fair)
    by_sender = dict(
        ScheduledPayment.objects.filter(id__in=[pid for pid, _ in claim.fresh])
        .values_list("from_account_id")
        .annotate(n=Count("id"))
    )
    assert all(by_sender.get(account.id) == 1 for account in others)
    assert by_sender[hot[0].id] + by_sender[hot[1].id] == BATCH - 30
    assert min(by_sender[hot[0].id], by_sender[hot[1].id]) >= CAP
    assert sorted(fair.hot) == sorted(a.id for a in hot)


@pytest.mark.django_db
def test_a_sender_found_hot_by_a_plain_claim_is_capped_from_the_next_claim_on():
    target, hot_sender = funded_account(), funded_account()
    others = [funded_account() for _ in range(5)]
    rows = [(f"pay_fair{n:08d}", hot_sender.id) for n in range(60)]
    rows += [(f"pay_fair{60 + n:08d}", account.id) for n, account in enumerate(others)]
    load_due(rows, target=target)
    fair = FairWalk(cap=5, claims=1)  # past the tick's first claim, nobody known hot: the plain claim
    first = claim_due(batch=20, lease_seconds=60, fair=fair)
    assert first.fresh_senders == {hot_sender.id: 20}
    assert fair.hot == [hot_sender.id] and fair.more
    second = claim_due(batch=20, lease_seconds=60, fair=fair)
    assert {account.id for account in others} <= set(second.fresh_senders)
    assert second.fresh_senders[hot_sender.id] == 15  # the room the others left


@pytest.mark.django_db
def test_a_tick_cut_short_hands_its_walk_to_the_next_tick(settings):
    settings.DELAYPAY_CLAIM_PER_SENDER = CAP
    _, others = hot_and_others(hot=4000, others=50)  # after all 4,000 of the hot sender's
    published = []
    for _ in range(3):  # each tick's budget ends after its first claim
        claim_and_publish(publish=published.extend, execute_in_process=None, batch=BATCH, budget_seconds=0)
    # Tick 1 walks 2,000 of the hot rows, tick 2 the other 2,000 from where tick 1 stopped,
    # tick 3 finds the others. Starting over each tick, they would wait for ~2,000 of the
    # hot sender's payments to drain first (tick 21).
    assert len(published) == 3
    assert others <= {pid for pid, _ in published[2]}


@pytest.mark.django_db
def test_a_fair_claim_reads_a_bounded_walk_however_large_the_hot_backlog():
    hot_sender, _ = hot_and_others(hot=5000, others=20)  # the others after all 5,000
    with connection.cursor() as cur:
        cur.execute("ANALYZE payments_scheduledpayment")
    batch = 50
    fair = FairWalk(cap=10, hot=[hot_sender.id], claims=1)  # mid-tick: the hot sender is known
    params = {**claim_params(batch=batch, lease_seconds=60), **fair.params(batch)}
    nodes = plan_nodes(sql.CLAIM_DUE_FAIR, params, analyze=True)
    scans = [n for n in nodes if n.get("Relation Name") == "payments_scheduledpayment"]
    assert scans
    for node in scans:
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        assert read <= batch * FAIR_WALK_BATCHES, (node["Node Type"], node.get("Index Name"), read)
    assert any(n.get("Index Name") == "payments_sender_due_idx" for n in scans)


@pytest.mark.django_db(transaction=True)
def test_four_fair_promoters_at_once_claim_each_payment_once():
    target = funded_account()
    hot = [funded_account() for _ in range(2)]
    others = [funded_account() for _ in range(100)]
    rows = [(f"pay_fair{n:08d}", hot[n % 2].id) for n in range(3000)]
    rows += [(f"pay_fair{n:08d}", others[k].id) for k, n in enumerate(range(5, 3000, 30))]
    rows = sorted(dict(rows).items())  # each position has one sender
    load_due(rows, target=target)
    total = len(rows)
    with Racers(4) as racers:
        results = racers.run(*[partial(drain_fair, batch=BATCH, cap=CAP)] * 4)
    assert not any(isinstance(r, Exception) for r in results), results
    taken = [pair for claims in results for claim in claims for pair in claim]
    assert len(taken) == len({pid for pid, _ in taken}) == total
    assert sum(1 for claims in results if any(claims)) > 1, "the promoters did not share the work"
    assert not ScheduledPayment.objects.filter(status=PaymentStatus.SCHEDULED).exists()
    # Nothing claimed twice: a second claim would have raised the attempt and written "reclaimed".
    assert ScheduledPayment.objects.filter(attempt=1).count() == total
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM payments_paymentevent WHERE kind IN ('claimed', 'reclaimed')")
        assert cur.fetchone() == (0,)


def settings_value(value: str | None) -> subprocess.CompletedProcess:
    code = "from django.conf import settings; print(settings.DELAYPAY_CLAIM_PER_SENDER)"
    return settings_in_child(code, DELAYPAY_CLAIM_PER_SENDER=value)


@pytest.mark.processes
@pytest.mark.parametrize(("value", "expected"), [(None, "50"), ("20", "20"), ("0", "0"), ("off", "0")])
def test_the_per_sender_cap_setting_reads_whole_numbers_and_off(value, expected):
    result = settings_value(value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.processes
@pytest.mark.parametrize("value", ["-1", "ten", "2.5"])
def test_the_per_sender_cap_setting_refuses_anything_else(value):
    result = settings_value(value)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DELAYPAY_CLAIM_PER_SENDER" in result.stderr
