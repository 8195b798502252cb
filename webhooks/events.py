"""The webhook event types, in one place.

The outbox triggers (migration 0002) map audit kinds to these types in SQL; the
``KIND_TO_TYPE`` maps below document the same mapping for Python readers and the
tests check that the two agree.
"""

PAYMENT_EXECUTED = "payment.executed"
PAYMENT_FAILED = "payment.failed"
PAYMENT_CANCELLED = "payment.cancelled"
PAYMENT_NEEDS_REVIEW = "payment.needs_review"
PAYMENT_RESCHEDULED = "payment.rescheduled"
RECURRING_PAUSED = "recurring_payment.paused"
RECURRING_RESUMED = "recurring_payment.resumed"
RECURRING_ENDED = "recurring_payment.ended"

EVENT_TYPES: tuple[str, ...] = (
    PAYMENT_EXECUTED,
    PAYMENT_FAILED,
    PAYMENT_CANCELLED,
    PAYMENT_NEEDS_REVIEW,
    PAYMENT_RESCHEDULED,
    RECURRING_PAUSED,
    RECURRING_RESUMED,
    RECURRING_ENDED,
)

# payments_paymentevent.kind -> type; other kinds (created, claimed, ...) are not webhooks.
PAYMENT_KIND_TO_TYPE: dict[str, str] = {
    "executed": PAYMENT_EXECUTED,
    "failed": PAYMENT_FAILED,
    "cancelled": PAYMENT_CANCELLED,
    "parked": PAYMENT_NEEDS_REVIEW,
    "updated": PAYMENT_RESCHEDULED,
}

# payments_recurringevent.kind -> type.
RECURRING_KIND_TO_TYPE: dict[str, str] = {
    "paused": RECURRING_PAUSED,
    "resumed": RECURRING_RESUMED,
    "ended": RECURRING_ENDED,
}

# The type each terminal payment status must have exactly one event of (reconciliation).
TERMINAL_STATUS_TO_TYPE: dict[str, str] = {
    "EXECUTED": PAYMENT_EXECUTED,
    "FAILED": PAYMENT_FAILED,
    "CANCELLED": PAYMENT_CANCELLED,
}
