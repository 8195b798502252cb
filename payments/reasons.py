"""What each failure and review reason code means, as a sentence for staff: the one mapping
the console shows next to the code (common/formats.py's ``Coded``). The codes themselves are
FailureReason and ReviewReason (payments/models.py), which the API and the CSV export keep
as they are. tests/payments/test_reasons.py checks that every code has its sentence."""

from common.formats import NOTHING, Coded

from .models import FailureReason, ReviewReason

FAILURE_REASON_SENTENCES = {
    FailureReason.INSUFFICIENT_FUNDS: "Insufficient funds: the sender's balance was below the amount",
    FailureReason.ACCOUNT_FROZEN: "Account frozen: staff froze the sending account, so nothing was sent",
    FailureReason.ACCOUNT_CLOSED: "Account closed: the sending or receiving account was closed",
    FailureReason.ATTEMPTS_EXHAUSTED: "Attempts exhausted: no worker recorded an outcome within the retry budget",
    FailureReason.EXPIRED: "Expired: it could not start before its execute_at plus expires_after",
    FailureReason.RESOLVED_BY_STAFF: "Resolved by staff: it waited in review and staff ended it as failed "
    "(their reason is in its events)",
    FailureReason.DECLINED: "Declined by the rail: the payout was refused and the reserved funds went back to "
    "the payer",
    FailureReason.PAYEE_DELETED: "Payee deleted: the payee was deleted before the payout was sent; nothing moved",
}

REVIEW_REASON_SENTENCES = {
    ReviewReason.ATTEMPTS_EXHAUSTED: "Workers started it as many times as the retry budget allows "
    "(DELAYPAY_MAX_ATTEMPTS) and none recorded an outcome",
    ReviewReason.OUTCOME_UNKNOWN: "The rail never said whether it paid this payout (timeouts or server errors "
    "through its retry budget); its funds stay reserved until it is resolved against the rail",
}


def failure_reason(code: str) -> Coded | str:
    """A failure reason with its sentence ("-" when there is none; an unknown code as it is)."""
    return Coded(code, FAILURE_REASON_SENTENCES.get(code, "")) if code else NOTHING


def review_reason(code: str) -> Coded | str:
    """A review reason with its sentence ("-" when there is none; an unknown code as it is)."""
    return Coded(code, REVIEW_REASON_SENTENCES.get(code, "")) if code else NOTHING
