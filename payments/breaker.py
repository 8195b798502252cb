"""Each rail's circuit breaker and pacing, shared by the whole fleet through one row per
rail (``RailState``), locked for each claim and each recorded round of rail calls.

The breaker (Nygard's, as in Hystrix or resilience4j): CLOSED lets payouts through; it
opens after ``DELAYPAY_RAIL_BREAKER_FAILURES`` consecutive failed calls, or when at least
``BREAKER_MIN_CALLS`` calls in a ``BREAKER_WINDOW_SECONDS`` window failed at
``BREAKER_ERROR_RATE`` or more. OPEN: none of the rail's payouts is claimed (they wait,
SCHEDULED, their budget untouched). After ``BREAKER_COOLDOWN_SECONDS`` it is HALF_OPEN:
``BREAKER_PROBES`` payouts are claimed; a probe answered closes it, a probe failed opens
it again. A failed call is one without an answer (a timeout, a dropped connection, a
5xx); a decline is an answer. Staff may force it open or closed (``breaker_force``).

Pacing: a token bucket per rail, ``DELAYPAY_RAIL_RATE_LIMIT`` tokens a second, holding at
most BURST_SECONDS of them (so a tick that runs a little late does not lose its share);
each payout claimed (a follow-up lookup included) spends one.
"""

import logging
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from common.db import database_now
from ledger.services import clean_reason

from .models import BreakerState, RailState

logger = logging.getLogger(__name__)


BURST_SECONDS = 1.25


def _locked_state(rail: str) -> RailState:
    """The rail's row, locked (one SELECT ... FOR UPDATE; created if a rail has none yet)."""
    return RailState.objects.select_for_update().get_or_create(rail=rail)[0]


def _set(state: RailState, breaker: str, now: datetime) -> None:
    if state.breaker != breaker:
        logger.warning("rail breaker %s", breaker, extra={"rail": state.rail, "from": state.breaker, "to": breaker})
    state.breaker = breaker
    state.opened_at = now if breaker != BreakerState.CLOSED else None
    state.probes_claimed = 0
    if breaker == BreakerState.CLOSED:
        state.consecutive_failures = 0
        state.window_started_at, state.window_calls, state.window_failures = now, 0, 0


def effective_breaker(state: RailState) -> str:
    """What the claim obeys: the staff's forced state, else the breaker's."""
    return state.forced or state.breaker


def take_allowance(*, rail: str, want: int) -> tuple[RailState, int]:
    """Inside the claim's transaction: lock the rail's row, refill its bucket, move an OPEN
    breaker whose cool-down is over to HALF_OPEN, and say how many of ``want`` payouts
    may be claimed now. The caller then claims and calls ``spend``."""
    state = _locked_state(rail)
    now = database_now(clock=True)
    rate = settings.DELAYPAY_RAIL_RATE_LIMIT
    elapsed = max((now - state.refilled_at).total_seconds(), 0.0)
    state.tokens = min(rate * BURST_SECONDS, state.tokens + rate * elapsed)
    state.refilled_at = now
    cooldown = timedelta(seconds=settings.DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS)
    if state.breaker == BreakerState.OPEN and now - state.opened_at >= cooldown:
        _set(state, BreakerState.HALF_OPEN, now)
    elif state.breaker == BreakerState.HALF_OPEN and now - state.opened_at >= cooldown + timedelta(
        seconds=settings.DELAYPAY_RAIL_TIMEOUT_SECONDS
    ):
        # The probes were claimed but never answered (their worker died): probe again.
        state.probes_claimed, state.opened_at = 0, now
    mode = effective_breaker(state)
    if mode == BreakerState.OPEN:
        allowed = 0
    elif mode == BreakerState.HALF_OPEN:
        allowed = max(settings.DELAYPAY_RAIL_BREAKER_PROBES - state.probes_claimed, 0)
    else:
        allowed = math.floor(state.tokens)
    return state, max(min(allowed, want), 0)


def spend(state: RailState, claimed: int) -> None:
    """After the claim, in its transaction: the tokens (and probes) it used."""
    state.tokens = max(state.tokens - claimed, 0.0)
    if effective_breaker(state) == BreakerState.HALF_OPEN:
        state.probes_claimed += claimed
    state.save(update_fields=["tokens", "refilled_at", "breaker", "opened_at", "probes_claimed",
                              "consecutive_failures", "window_started_at", "window_calls", "window_failures"])


def record_calls(*, rail: str, answered: list[bool]) -> str:
    """Record one round of rail calls (True: the rail answered) and move the breaker.
    Its own short transaction. Returns the breaker's state after it."""
    if not answered:
        return ""
    with transaction.atomic():
        state = _locked_state(rail)
        now = database_now(clock=True)
        if (now - state.window_started_at).total_seconds() > settings.DELAYPAY_RAIL_BREAKER_WINDOW_SECONDS:
            state.window_started_at, state.window_calls, state.window_failures = now, 0, 0
        failures = answered.count(False)
        state.window_calls += len(answered)
        state.window_failures += failures
        for ok in answered:
            state.consecutive_failures = 0 if ok else state.consecutive_failures + 1
        if state.breaker == BreakerState.HALF_OPEN:
            _set(state, BreakerState.OPEN if failures else BreakerState.CLOSED, now)
        elif state.breaker == BreakerState.CLOSED and (
            state.consecutive_failures >= settings.DELAYPAY_RAIL_BREAKER_FAILURES
            or (state.window_calls >= settings.DELAYPAY_RAIL_BREAKER_MIN_CALLS
                and state.window_failures >= settings.DELAYPAY_RAIL_BREAKER_ERROR_RATE * state.window_calls)
        ):
            _set(state, BreakerState.OPEN, now)
        state.updated_at = now
        state.save()
        return state.breaker


def breaker_force(*, rail: str, forced: str, actor, reason: str) -> RailState:
    """Staff hold the breaker ``open`` or ``closed`` (or clear the hold: ``""``), with a
    reason; the breaker's own state restarts from CLOSED when a hold is cleared."""
    if forced not in ("", BreakerState.OPEN, BreakerState.CLOSED):
        raise ValueError(f"forced must be '', 'open' or 'closed', not {forced!r}")
    reason = clean_reason(reason)
    with transaction.atomic():
        state = _locked_state(rail)
        now = database_now(clock=True)
        if not forced:
            _set(state, BreakerState.CLOSED, now)
        state.forced, state.forced_by, state.forced_reason = forced, getattr(actor, "username", str(actor)), reason
        state.updated_at = now
        state.save()
    logger.warning("rail breaker forced", extra={"rail": rail, "forced": forced or "cleared",
                                                 "actor": getattr(actor, "pk", None)})
    return state
