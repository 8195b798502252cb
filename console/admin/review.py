"""A payment's page beyond its fields: its payout at the rail, the staff acts on it
(cancel, re-drive, resolve as failed; each through a confirmation page with a reason)
and its timeline of events and attempts."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.contrib import admin
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

from common.admin_tools import (
    ConfirmedAct,
    ReasonForm,
    badge,
)
from common.authz import staff_may_view
from common.formats import human
from console.forms import RedriveForm, ReviewForm
from payments.models import (
    ExecutionAttempt,
    PaymentEvent,
    PaymentStatus,
    Payout,
    ScheduledPayment,
)
from payments.services import payment_cancel_by_staff, payment_redrive, payment_resolve

from .display import actor_usernames, data_text


def payout_of(payment) -> Payout | None:
    """A payout's record at its rail (none until its funds are reserved), read once per page."""
    if not hasattr(payment, "_payout_record"):
        payment._payout_record = Payout.objects.filter(pk=payment.pk).first()
    return payment._payout_record


def payout_field(attr: str, description: str, render=human):
    """A row of the payment page's "At the rail" section: ``attr`` of its payout record."""

    @admin.display(description=description)
    def field(model_admin, obj):
        payout = payout_of(obj)
        value = getattr(payout, attr) if payout is not None else None
        return render(value) if value not in (None, "") else "-"

    return field


@dataclass(frozen=True, kw_only=True)
class PaymentAct(ConfirmedAct):
    """Cancel, re-drive or resolve: the confirmation page's words and the service, run on
    each payment. ``run`` returns (the payment, whether this call changed it)."""

    eligible: tuple[str, ...]  # the statuses it changes; the page marks the rest "left alone"
    ineligible: str  # what the rest are called on the page
    done: str
    already: str
    refused: str  # the report of a payment in another status ("Too late to cancel: pay_... is EXECUTED")
    run: Callable[..., tuple[ScheduledPayment, bool]]  # (payment_id=, actor=, data=form.cleaned_data)


# The confirmation page's reason for leaving a payout with reserved funds out of a cancel.
RESERVED_AT_RAIL = "funds reserved at the rail, outcome unknown: resolve it instead"


def _cancel(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_cancel_by_staff(payment_id=payment_id, actor=actor, reason=data["reason"])
    return outcome.payment, outcome.cancelled_now


def _redrive(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_redrive(
        payment_id=payment_id, actor=actor, reason=data["reason"], execute_at=data.get("execute_at")
    )
    return outcome.payment, outcome.changed_now


def _resolve(*, payment_id: str, actor, data: dict) -> tuple[ScheduledPayment, bool]:
    outcome = payment_resolve(payment_id=payment_id, actor=actor, outcome="failed", reason=data["reason"])
    return outcome.payment, outcome.changed_now


PAYMENT_ACTS = (
    PaymentAct(
        name="cancel",
        title="Cancel",
        explanation="Each payment that is SCHEDULED or in review ends CANCELLED: the same compare-and-set as "
        "DELETE /api/v1/payments/{id}, so it races a worker's claim and exactly one wins. No money moves. The "
        "cancel is recorded in the payment's event history and in the ledger's staff actions, with your reason. "
        "A payout whose funds are reserved at its rail is refused (the rail may have paid it): resolve it instead.",
        permission="cancel",
        form=ReasonForm,
        eligible=(PaymentStatus.SCHEDULED, PaymentStatus.NEEDS_REVIEW),
        ineligible="already claimed, finished or cancelled",
        done="Cancelled",
        already="Already cancelled",
        refused="Too late to cancel",
        run=_cancel,
    ),
    PaymentAct(
        name="redrive",
        title="Re-drive",
        explanation="Each payment in review goes back to SCHEDULED with a fresh retry budget, due at once or at "
        "the time given, and executes like any other payment.",
        permission="redrive",
        form=RedriveForm,
        eligible=(PaymentStatus.NEEDS_REVIEW,),
        ineligible="not in review",
        done="Re-driven",
        already="Already re-driven",
        refused="Not in review",
        run=_redrive,
    ),
    PaymentAct(
        name="resolve",
        title="Resolve as failed",
        explanation="Each payment in review ends FAILED with failure_reason resolved_by_staff. No money moves. "
        "For a payout whose funds are reserved, its rail is asked first: nothing there (or declined), the reserve is "
        "voided and the money goes back to the payer; paid there, the resolve is refused (re-drive it: it is then "
        "recorded as executed); no answer, it is refused (try again later).",
        permission="redrive",
        form=ReviewForm,
        eligible=(PaymentStatus.NEEDS_REVIEW,),
        ineligible="not in review",
        done="Resolved as failed",
        already="Already resolved as failed",
        refused="Not in review",
        run=_resolve,
    ),
)
PAYMENT_ACT = {act.name: act for act in PAYMENT_ACTS}


# A payment's timeline shows at most this many attempts and events (a payment has a few;
# a re-driven one a few dozen).
MAX_TIMELINE_ROWS = 500


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    what: object  # text or safe HTML
    actor: str
    detail: str

    @property
    def when(self) -> str:
        return human(self.at)


def _event_detail(event: PaymentEvent) -> str:
    parts = [f"attempt {event.attempt}"] if event.attempt else []
    if event.data:
        parts.append(data_text(event.data))
    return "; ".join(parts)


def _attempt_entry(attempt: ExecutionAttempt) -> TimelineEntry:
    took = (attempt.finished_at - attempt.started_at).total_seconds() * 1000
    detail = "; ".join(part for part in (attempt.error, f"took {took:,.0f} ms") if part)
    outcome = badge(attempt.outcome, ATTEMPT_TONES.get(attempt.outcome, "grey"))
    return TimelineEntry(attempt.started_at, format_html("attempt {}: {}", attempt.attempt, outcome),
                         attempt.worker or "-", detail)


CLAIM_KINDS = (PaymentEvent.Kind.CLAIMED, PaymentEvent.Kind.RECLAIMED)


@dataclass(frozen=True)
class FirstClaim:
    """When a payment's first attempt was claimed, and where that time is read from."""

    at: datetime
    source: str


def first_claim(payment, events: list[PaymentEvent]) -> FirstClaim | None:
    """When the payment's first attempt was claimed, where no event says it: a first claim
    writes none (decision record 0010). The row's claimed_at while attempt 1 is its latest
    claim; afterwards the second attempt's "reclaimed" event keeps it. None when it was
    never claimed, or when a "claimed" event of its own says when (a payment claimed
    before that change)."""
    if payment.attempt < 1 or any(e.kind == PaymentEvent.Kind.CLAIMED for e in events):
        return None
    if payment.attempt == 1:
        return FirstClaim(payment.claimed_at, "the payment's claimed_at") if payment.claimed_at else None
    second = next((e for e in events if e.kind == PaymentEvent.Kind.RECLAIMED and e.attempt == 2), None)
    previous = (second.data or {}).get("previous_claimed_at") if second else None
    at = parse_datetime(previous) if isinstance(previous, str) else None
    return FirstClaim(at, "the second claim's previous_claimed_at") if at else None


def _first_claim_entries(claim: FirstClaim, attempts: dict[int, ExecutionAttempt]) -> list[TimelineEntry]:
    """The first claim (from first_claim) and, right after it, the attempt it started."""
    entries = [TimelineEntry(claim.at, "claimed SCHEDULED → EXECUTING", "promoter",
                             f"attempt 1; a first claim writes no event: the time is {claim.source}")]
    if 1 in attempts:
        entries.append(_attempt_entry(attempts.pop(1)))
    return entries


def payment_timeline(*, user, payment) -> tuple[list[TimelineEntry], list[str]]:
    """The payment's events (in the order they were written) with each attempt right after
    the claim that started it, and what the user may not see of it (events and attempts
    each need their view permission, as the admin's lists of them). An attempt without its
    claim among the events goes where its start time puts it."""
    hidden = []
    events, attempts = [], {}
    if staff_may_view(user, PaymentEvent):
        events = list(
            PaymentEvent.objects.filter(payment_id=payment.pk).select_related("actor_user").order_by("id")[
                :MAX_TIMELINE_ROWS
            ]
        )
    else:
        hidden.append("events")
    if staff_may_view(user, ExecutionAttempt):
        rows = ExecutionAttempt.objects.filter(payment_id=payment.pk).order_by("attempt")[:MAX_TIMELINE_ROWS]
        attempts = {attempt.attempt: attempt for attempt in rows}
    else:
        hidden.append("attempts")
    entries = []
    usernames = actor_usernames(e.actor for e in events if not e.actor_user_id)
    pending_claim = first_claim(payment, events) if "events" not in hidden else None
    for event in events:
        if pending_claim and event.created_at >= pending_claim.at and event.kind != PaymentEvent.Kind.CREATED:
            entries += _first_claim_entries(pending_claim, attempts)
            pending_claim = None
        what = [event.kind]
        if event.from_status != event.to_status:
            what += [event.from_status, "→", event.to_status] if event.from_status else ["→", event.to_status]
        actor = event.actor_user.get_username() if event.actor_user_id else usernames.get(event.actor, event.actor)
        entries.append(TimelineEntry(event.created_at, " ".join(what), actor, _event_detail(event)))
        if event.kind in CLAIM_KINDS and event.attempt in attempts:
            entries.append(_attempt_entry(attempts.pop(event.attempt)))
    if pending_claim:
        entries += _first_claim_entries(pending_claim, attempts)
    for attempt in attempts.values():  # their claim is not among the events shown
        later = next((i for i, entry in enumerate(entries) if entry.at > attempt.started_at), len(entries))
        entries.insert(later, _attempt_entry(attempt))
    return entries, hidden


ATTEMPT_TONES = {
    ExecutionAttempt.Outcome.EXECUTED: "green",
    ExecutionAttempt.Outcome.ALREADY_APPLIED: "green",
    ExecutionAttempt.Outcome.FAILED: "red",
    ExecutionAttempt.Outcome.ERROR: "amber",
    ExecutionAttempt.Outcome.UNKNOWN: "amber",
    ExecutionAttempt.Outcome.PARKED: "purple",
    ExecutionAttempt.Outcome.STALE: "grey",
}
