"""The promoter: claims due payments from the table and hands them to the executors.

The database is the schedule. Each tick claims batches of due rows (and rows whose
lease expired) with ``FOR UPDATE SKIP LOCKED`` on the database clock, commits, and
only then publishes ``execute_batch`` messages. A crash between the commit and the
publish leaves rows EXECUTING with a lease; the first claim after it expires takes
them again (attempt + 1). Redis is transport, never truth.
"""

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.db import connection, transaction

from rails.base import RAIL_NAMES

from . import breaker, metrics, services, sql
from .execution import worker_name
from .models import Heartbeat
from .worker import run_batch

logger = logging.getLogger(__name__)
outcome_logger = logging.getLogger("payments.outcomes")

# The execute message's contract: this task name, args [[[payment_id, attempt], ...]].
# Published by name, so the promoter needs no import of the tasks module.
EXECUTE_TASK = "payments.tasks.execute_batch"
# Payouts go to their own queue and process (the Procfile's ``payouts``): a slow rail never
# holds the internal transfers' workers. Same args.
PAYOUT_TASK = "payments.tasks.execute_payouts"

Pair = tuple[str, int]  # (payment_id, attempt)

@dataclass
class Claim:
    fresh: list[Pair] = field(default_factory=list)  # were SCHEDULED (due, or a retry whose wait is over)
    reclaimed: list[Pair] = field(default_factory=list)  # lease had expired
    # Of the reclaimed, those a worker had started (it died or hung mid-way): suspects.
    started: set[Pair] = field(default_factory=set)
    dispatch_lateness: list[float] = field(default_factory=list)  # seconds, of the fresh ones
    fresh_senders: Counter = field(default_factory=Counter)  # from_account_id: fresh rows claimed

    def __len__(self) -> int:
        return len(self.fresh) + len(self.reclaimed)

    def add_rows(self, rows) -> None:
        """The rows a claim statement returned: (id, attempt, previous status, lateness, started, sender)."""
        for payment_id, attempt, previous, lateness, started, sender in rows:
            if previous == "SCHEDULED":
                self.fresh.append((payment_id, attempt))
                self.dispatch_lateness.append(lateness)
                self.fresh_senders[sender] += 1
            else:
                self.reclaimed.append((payment_id, attempt))
                if started:
                    self.started.add((payment_id, attempt))


@dataclass
class TickResult:
    claimed: int = 0
    reclaimed: int = 0
    messages: int = 0
    executed_in_process: int = 0
    in_flight: int = 0
    capped: bool = False
    seconds: float = 0.0
    dispatch_lateness: list[float] = field(default_factory=list)  # claimed_at - execute_at, fresh claims
    reclaimed_pairs: list[Pair] = field(default_factory=list)
    payouts: int = 0  # payouts claimed (fresh and follow-ups), within their rails' allowance
    hot_senders: list[str] = field(default_factory=list)  # capped per claim at the tick's end (FairWalk)


def claim_params(*, batch: int, lease_seconds: float, actor: str = "promoter") -> dict:
    """sql.CLAIM_DUE's parameters."""
    return {"batch": batch, "reclaim_batch": batch, "lease": float(lease_seconds), "actor": actor}


HASH_RANGE = 2**31  # sql.SHARD_HASH: hashtext(id) with its sign bit off, 0 .. 2**31 - 1


@dataclass(frozen=True)
class Shard:
    """Which part of the due rows a tick claims (DELAYPAY_CLAIM_SHARDS): the rows whose id
    hashes into the ``index``-th of ``count`` equal slices of the hash range
    (sql.CLAIM_DUE_SHARD). The beat sends one tick per shard each period; any promoter
    process takes any shard's tick, so a shard waits for none in particular. ``ALL``
    (count 1): every row, today's single claim."""

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count} does not exist")

    @property
    def sharded(self) -> bool:
        return self.count > 1

    @property
    def first(self) -> bool:
        """The shard whose tick also does the once-per-period work (recurring generation,
        payouts): a tick of every shard would only contend for the same rows."""
        return self.index == 0

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def params(self) -> dict:
        """The bounds of the shard's slice of the hash range (sql.CLAIM_DUE_SHARD)."""
        if not self.sharded:
            return {}
        return {
            "shard_low": self.index * HASH_RANGE // self.count,
            "shard_high": (self.index + 1) * HASH_RANGE // self.count,
        }


Shard.ALL = Shard()


# How far one fair claim looks along the due order, in claim batches: far enough that a
# hot sender's rows ahead of the others' cost the others few claims (20 x 500 = 10,000
# entries: a 50,000-payment backlog is walked in 5 claims), near enough that such a claim
# costs about twice a plain one (83 against 42 ms, median, on the shared 2-core machine).
# Only the tick's first claim and the claims made while a hot sender is known walk this
# far, and the cursor makes each stretch of the due order walked once; while no sender is
# hot the plain CLAIM_DUE serves.
FAIR_WALK_BATCHES = 20
# A tick cut short (budget spent, in-flight cap reached) while a hot sender is being
# drained hands its FairWalk to the next tick, so the next tick goes on from the cursor
# rather than walking the hot sender's whole backlog again: without it every tick of a
# 50,000-payment burst re-walked all of it, and the promoter, slower by that walk, became
# the burst's bottleneck (docs/reference/benchmarks.md#fairness). A walk is carried for
# at most this many seconds from its start: a payment that became due behind its cursor
# (an occurrence generated late, a payment re-driven from review) waits that long at most.
FAIR_CARRY_SECONDS = 10.0
_WALK_START = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), "")
_carried = threading.local()  # the degraded-mode thread (payments/fallback.py) keeps its own


@dataclass
class FairWalk:
    """A tick's state of the fair claim (sql.CLAIM_DUE_FAIR): the cap, the senders found
    hot (more than ``cap`` rows in one walk), and the cursor in the due order the next
    claim's walk starts after. A new walk starts from the oldest due row, so a row passed
    over (held by another promoter whose claim then rolled back) waits for the next one:
    the next tick's, or at most FAIR_CARRY_SECONDS while a hot sender is being drained."""

    cap: int
    hot: list[str] = field(default_factory=list)
    after: tuple[datetime, str] = _WALK_START
    claims: int = 0
    more: bool = True  # the due order may hold more to claim in this tick
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  # when the last tick that used it ended
    carry: bool = False  # the next tick goes on with it

    @classmethod
    def for_tick(cls, cap: int, shard: "Shard" = Shard.ALL) -> "FairWalk":
        """The walk a tick starts with: the previous tick's of the same shard, if it was
        handed on (see FAIR_CARRY_SECONDS) and that tick just ended, else a new one from the
        oldest due row (of the shard)."""
        walks = _carried.__dict__.setdefault("walks", {})
        walk = walks.get(shard)
        now = time.monotonic()
        if (
            walk is not None and walk.carry and walk.cap == cap and walk.ended is not None
            and now - walk.ended <= 2 * settings.PROMOTER_TICK_SECONDS + 1
            and now - walk.started <= FAIR_CARRY_SECONDS
        ):
            walk.carry, walk.more = False, True
            return walk
        walk = walks[shard] = cls(cap=cap)
        return walk

    def end_tick(self, *, cut_short: bool) -> None:
        self.ended = time.monotonic()
        self.carry = cut_short and bool(self.hot)

    @property
    def plain(self) -> bool:
        """No sender is known to be hot past the tick's first (fair) claim: the plain claim
        serves, and costs less (no walk, no second lock per row); after_plain watches it."""
        return self.claims > 0 and not self.hot

    def after_plain(self, claim: Claim, *, batch: int) -> None:
        """A sender with more than its cap of a plain claim's rows is hot from now on: the
        next claim is fair again, walking from the oldest due row (what the plain claims took
        is no longer due; what is left of the hot senders' rows is what the walk passes)."""
        cap = self._cap(batch)
        hot = [sender for sender, n in claim.fresh_senders.most_common(self._max_hot(batch, cap)) if n > cap]
        self.claims += 1
        if hot:
            self.hot, self.after, self.more = hot, _WALK_START, True
        else:
            self.more = False  # the plain claim's own rule: a short claim ends the tick

    def _cap(self, batch: int) -> int:
        # A cap of half the batch or more never leaves room for anyone else: clamp it, so
        # that the fresh rows always get at least half of every claim.
        return max(1, min(self.cap, batch // 2))

    def _max_hot(self, batch: int, cap: int) -> int:
        return max(1, batch // (2 * cap))

    def params(self, batch: int) -> dict:
        cap = self._cap(batch)
        wide = self.claims == 0 or self.hot
        return {
            "cap": cap,
            "max_hot": self._max_hot(batch, cap),
            "hot": self.hot,
            "walk": batch * FAIR_WALK_BATCHES if wide else batch,
            "after_at": self.after[0],
            "after_id": self.after[1],
        }

    def advance(self, summary: Sequence, *, walk: int) -> None:
        """Move on after a claim, from its summary columns (see sql.CLAIM_DUE_FAIR)."""
        walked, walk_at, walk_id, fresh, fresh_limit, fresh_at, fresh_id, hot = summary
        self.claims += 1
        self.hot = list(hot or [])
        if fresh >= fresh_limit:
            # The fresh rows filled their share (none, when the room was tiny): what the
            # walk saw after the last one taken is walked again next time.
            if fresh_at is not None:
                self.after = (fresh_at, fresh_id)
            filled = True
        else:
            # Every other sender's row the walk saw is claimed (or held by another
            # promoter, which claims it): the next walk starts after this one.
            if walk_at is not None:
                self.after = (walk_at, walk_id)
            filled = False
        self.more = filled or walked >= walk or bool(self.hot)


def _claim_rows(cur, statement: str, params: dict) -> list:
    """Run one claim statement under the claim's planner setting (sql.CLAIM_SESSION), set
    back after it; a claim that fails rolls its transaction back and the setting with it."""
    cur.execute(sql.CLAIM_SESSION)
    cur.execute(statement, params)
    rows = cur.fetchall()
    cur.execute(sql.CLAIM_SESSION_END)
    return rows


def claim_due(
    *, batch: int, lease_seconds: float, actor: str = "promoter", fair: FairWalk | None = None,
    shard: Shard = Shard.ALL,
) -> Claim:
    """Claim up to ``batch`` due rows and up to ``batch`` expired leases. Commits.

    ``fair``: the tick's FairWalk: claim with per-sender fairness (sql.CLAIM_DUE_FAIR)
    and move it on; without it, plain due order (sql.CLAIM_DUE). ``shard``: only that
    shard's rows (the _SHARD variants of both)."""
    claim = Claim()
    params = {**claim_params(batch=batch, lease_seconds=lease_seconds, actor=actor), **shard.params()}
    with transaction.atomic(), connection.cursor() as cur:
        if fair is None or fair.plain:
            claim.add_rows(_claim_rows(cur, sql.CLAIM_DUE_SHARD if shard.sharded else sql.CLAIM_DUE, params))
            if fair is not None:
                fair.after_plain(claim, batch=batch)
            return claim
        fair_params = fair.params(batch)
        rows = _claim_rows(cur, sql.CLAIM_DUE_FAIR_SHARD if shard.sharded else sql.CLAIM_DUE_FAIR,
                           {**params, **fair_params})
        claim.add_rows([row[:6] for row in rows if row[0] is not None])
    fair.advance(rows[0][6:], walk=fair_params["walk"])
    return claim


def claim_payouts(*, rail: str, batch: int, lease_seconds: float, actor: str = "promoter") -> Claim:
    """Claim up to ``batch`` of one rail's due payouts (and follow-ups whose lease ran out),
    within what its breaker and its pacing allow now (payments/breaker.py). Commits."""
    claim = Claim()
    with transaction.atomic(), connection.cursor() as cur:
        state, allowance = breaker.take_allowance(rail=rail, want=batch)
        if allowance > 0:
            claim.add_rows(_claim_rows(cur, sql.CLAIM_PAYOUTS_DUE, {
                **claim_params(batch=allowance, lease_seconds=lease_seconds, actor=actor), "rail": rail,
            }))
        breaker.spend(state, len(claim))
    return claim


def publish_payouts(messages: Sequence[list[Pair]]) -> None:
    with current_app.producer_or_acquire() as producer:
        for pairs in messages:
            current_app.send_task(PAYOUT_TASK, args=[pairs], producer=producer, retry=False)


def payouts_tick(
    *, publish: Callable[[Sequence[list[Pair]]], None], deadline: float, lease_seconds: float, result: "TickResult"
) -> None:
    """Claim and publish each rail's payouts, batch by batch, until its allowance is spent,
    nothing is due or the tick's budget is. A publish that fails leaves the claim to its
    lease (no worker started it: no try is spent); the payouts wait for Redis."""
    batch = settings.DELAYPAY_RAIL_CLAIM_BATCH
    for rail in RAIL_NAMES:
        while True:
            claim = claim_payouts(rail=rail, batch=batch, lease_seconds=lease_seconds)
            if not claim:
                break
            result.payouts += len(claim)
            result.dispatch_lateness += claim.dispatch_lateness
            try:
                publish([claim.fresh + claim.reclaimed])
                result.messages += 1
            except Exception:
                logger.exception("publishing %d claimed payouts failed; they wait for their lease", len(claim))
                return
            if len(claim) < batch or time.monotonic() >= deadline:
                break


def count_in_flight() -> int:
    with connection.cursor() as cur:
        cur.execute(sql.COUNT_IN_FLIGHT)
        return cur.fetchone()[0]


def messages_for(claim: Claim) -> list[list[Pair]]:
    """One message for the fresh batch; one for the re-claimed payments whose message was
    lost before any worker started it (workers down, Redis restarted): they are innocent,
    and thousands of them after an outage go out in batches; one message each for the
    re-claimed payments a worker had started: such a payment may be the one that killed
    its worker, and alone it cannot take a healthy batch down with it again.
    """
    messages = [claim.fresh] if claim.fresh else []
    lost = [pair for pair in claim.reclaimed if pair not in claim.started]
    if lost:
        messages.append(lost)
    messages.extend([pair] for pair in claim.reclaimed if pair in claim.started)
    return messages


# The execute queue's two priorities (Redis: kombu keeps a list per priority step, 0, 3,
# 6 and 9, and every consumer takes from step 0 first). A payment released at its instant
# is sent ON_TIME; a tick's claim and a release claim that came back a whole batch (a
# burst, a backlog, retries, re-claims) are sent BACKLOG. So the payments falling due while
# a burst drains wait for the batches the workers already hold, not behind the burst's
# whole backlog in Redis (docs/decisions/0019-release-at-the-instant.md). A consumer of an
# older release reads every step as well; common.broker.queue_lengths counts every step.
ON_TIME_PRIORITY = 0
BACKLOG_PRIORITY = 6


def publish_messages(messages: Sequence[list[Pair]], *, priority: int = BACKLOG_PRIORITY) -> None:
    """Publish every message of one claim over a single producer connection."""
    with current_app.producer_or_acquire() as producer:
        for pairs in messages:
            current_app.send_task(EXECUTE_TASK, args=[pairs], producer=producer, retry=False, priority=priority)


def hand_over(
    messages: Sequence[list[Pair]], *, degraded: bool, publish: Callable[[Sequence[list[Pair]]], None],
    execute_in_process: Callable[[list[Pair]], None],
) -> tuple[int, int]:
    """Publish one claim's messages; ``degraded``, or when the publish fails (Redis is
    down), execute them here instead, so that they neither wait for their lease to expire
    nor burn an attempt. Returns (messages published, payments executed in-process)."""
    if not degraded:
        try:
            publish(messages)
            return len(messages), 0
        except Exception:
            logger.exception("publish failed; executing %d claimed payments in-process", sum(map(len, messages)))
    executed = 0
    for message in messages:
        execute_in_process(message)
        executed += len(message)
    return 0, executed


# What the first shard's tick does before its claim, registered by the apps above the
# engine in their AppConfig.ready (recurring/apps.py: generate the series' due
# occurrences). The engine knows no series: it calls what was registered, in order. A
# hook must never raise (recurring_generate_due does not).
FIRST_SHARD_HOOKS: list[Callable[[], object]] = []


def register_first_shard_hook(hook: Callable[[], object]) -> None:
    """Run ``hook`` at the start of every first shard's tick (once, however often registered)."""
    if hook not in FIRST_SHARD_HOOKS:
        FIRST_SHARD_HOOKS.append(hook)


def execute_in_process(pairs: list[Pair]) -> None:
    """Execute one message's batch here, in the promoter (the fallback when Redis is down)."""
    run_batch([tuple(p) for p in pairs], worker=f"promoter:{worker_name()}")


def run_tick(*, degraded: bool = False, shard: Shard = Shard.ALL) -> "TickResult":
    """One beat tick (the promoter_tick task): generate due recurring occurrences, claim
    due payments and publish them, then record the heartbeat, metrics and log lines.
    ``degraded``: a tick of the fallback while Redis is down (payments/fallback.py).
    ``shard``: the tick's claim shard (DELAYPAY_CLAIM_SHARDS); recurring generation and
    payouts are the first shard's work."""
    if shard.first:
        # recurring/services.py's recurring_generate_due, registered by recurring/apps.py.
        # Never raises: in bounded batches, a series that cannot be generated now (a lock
        # timeout, a deadlock, bad data) is rolled back alone, logged, counted and tried
        # again next tick, and the claim below goes ahead.
        for hook in FIRST_SHARD_HOOKS:
            hook()
    result = claim_and_publish(degraded=degraded, shard=shard)
    services.heartbeat_record(name=Heartbeat.PROMOTER)
    if shard.sharded:
        services.heartbeat_record(name=Heartbeat.shard_name(shard.index))
    elif settings.DELAYPAY_CLAIM_SHARDS > 1:
        # A tick of every shard (degraded mode's own timer): each shard was served.
        for index in range(settings.DELAYPAY_CLAIM_SHARDS):
            services.heartbeat_record(name=Heartbeat.shard_name(index))
    metrics.record_tick(result)
    for payment_id, attempt in result.reclaimed_pairs:
        outcome_logger.info(
            "payment reclaimed after its lease expired",
            extra={"payment_id": payment_id, "attempt": attempt, "outcome": "reclaimed"},
        )
    if result.claimed or result.payouts:
        logger.info(
            "promoter tick",
            extra={
                "claimed": result.claimed,
                "payouts": result.payouts,
                "reclaimed": result.reclaimed,
                "messages": result.messages,
                "executed_in_process": result.executed_in_process,
                "in_flight": result.in_flight,
                "capped": result.capped,
                "hot_senders": result.hot_senders,
                "shard": shard.label,
                "degraded": degraded,
                "tick_ms": round(result.seconds * 1000, 1),
                "max_dispatch_lateness_s": round(max(result.dispatch_lateness, default=0.0), 3),
            },
        )
    return result


def claim_and_publish(
    *,
    publish: Callable[[Sequence[list[Pair]]], None] = publish_messages,
    execute_in_process: Callable[[list[Pair]], None] = execute_in_process,
    batch: int | None = None,
    lease_seconds: float | None = None,
    budget_seconds: float | None = None,
    in_flight_cap: int | None = None,
    degraded: bool = False,
    publish_payouts: Callable[[Sequence[list[Pair]]], None] = publish_payouts,
    shard: Shard = Shard.ALL,
) -> TickResult:
    """Claim and publish until nothing is due, the budget is spent or the cap is hit.

    ``publish`` sends messages after each claim's commit. If it raises (Redis is down),
    the rows just claimed are executed here, in-process, so they neither wait for
    their lease to expire nor burn an attempt; the tick then stops claiming.
    ``degraded`` (Redis is known to be down, payments/fallback.py): no publish is tried;
    one claim is executed in-process, as when publishing fails.
    ``shard``: claim that shard's rows only, within its share of the in-flight cap (the
    K shards' ticks run side by side, each counting the same in-flight payments).
    """
    batch = batch or settings.DELAYPAY_CLAIM_BATCH
    lease_seconds = lease_seconds or settings.DELAYPAY_LEASE_SECONDS
    budget_seconds = settings.DELAYPAY_PROMOTER_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    in_flight_cap = in_flight_cap or settings.DELAYPAY_INFLIGHT_CAP

    started = time.monotonic()
    deadline = started + budget_seconds
    result = TickResult()
    if not degraded and shard.first:
        # Payouts first: their claims are bounded by their rails' pacing, so they never
        # starve the internal claims below, which go on until the budget is spent. While
        # Redis is down payouts wait: the promoter never calls a rail in its tick.
        payouts_tick(publish=publish_payouts, deadline=deadline, lease_seconds=lease_seconds, result=result)
    in_flight = count_in_flight()
    if shard.sharded:
        in_flight_cap = in_flight + max(0, in_flight_cap - in_flight) // shard.count
    # Per-sender fairness (DELAYPAY_CLAIM_PER_SENDER, 0: off): the tick's claims share one
    # FairWalk. A fair claim can come back short or empty while the due order holds more
    # (its walk passed a hot sender's rows, or rows another promoter holds): it goes on
    # while the walk says so, within the budget.
    per_sender = settings.DELAYPAY_CLAIM_PER_SENDER
    fair = FairWalk.for_tick(per_sender, shard) if per_sender else None
    while True:
        room = in_flight_cap - in_flight
        if room <= 0:
            result.capped = True
            break
        claim = claim_due(batch=min(batch, room), lease_seconds=lease_seconds, fair=fair, shard=shard)
        more = fair is not None and fair.more
        if not claim and not more:
            break
        result.claimed += len(claim)
        result.reclaimed += len(claim.reclaimed)
        result.reclaimed_pairs += claim.reclaimed
        result.dispatch_lateness += claim.dispatch_lateness
        in_flight += len(claim)
        published, executed = hand_over(messages_for(claim), degraded=degraded, publish=publish,
                                        execute_in_process=execute_in_process)
        result.messages += published
        result.executed_in_process += executed
        if degraded or executed:
            degraded = True
            in_flight -= len(claim)
            break
        if (len(claim) < min(batch, room) and not more) or time.monotonic() >= deadline:
            break
    if fair is not None:
        fair.end_tick(cut_short=result.capped or degraded or time.monotonic() >= deadline)
        result.hot_senders = list(fair.hot)
    result.in_flight = in_flight
    result.seconds = time.monotonic() - started
    return result
