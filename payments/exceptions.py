"""Domain errors. Each carries the stable ``code`` clients see and knows nothing of HTTP:
api/errors.py maps them to statuses in one place."""


class DomainError(Exception):
    code = "error"
    default_detail = "The request could not be completed."

    def __init__(self, detail: str | None = None, **extra):
        self.detail = detail or self.default_detail
        self.extra = extra
        super().__init__(self.detail)


class PaymentValidationError(DomainError):
    """Business-rule validation that needs the database (ownership, account state, clock)."""

    code = "validation_error"
    default_detail = "Invalid input."

    def __init__(self, fields: dict[str, list[str]], detail: str | None = None):
        super().__init__(detail, fields=fields)
        self.fields = fields


class PaymentNotFound(DomainError):
    code = "not_found"
    default_detail = "No such payment."


class PaymentArchived(PaymentNotFound):
    """An id in a month that left the database (payments/partitions.py): the payment, if
    it existed, finished long ago and is in the archive, outside the API."""

    code = "payment_archived"

    def __init__(self, month: str):
        super().__init__(f"Payments created in {month} were archived; their records are with the operator.",
                         archived_month=month)


class AccountNotFound(DomainError):
    code = "not_found"
    default_detail = "No such account."


class PaymentNotCancellable(DomainError):
    code = "payment_not_cancellable"

    def __init__(self, status: str):
        super().__init__(f"The payment is {status} and can no longer be cancelled.", status=status)
        self.status = status


class PaymentNotEditable(DomainError):
    code = "payment_not_editable"

    def __init__(self, status: str):
        super().__init__(f"The payment is {status} and can no longer be changed.", status=status)
        self.status = status


class PaymentNotInReview(DomainError):
    """Re-drive or resolve of a payment that is not (or no longer) NEEDS_REVIEW."""

    code = "payment_not_in_review"

    def __init__(self, status: str):
        super().__init__(f"The payment is {status}, not NEEDS_REVIEW.", status=status)
        self.status = status


class PaymentReviewForbidden(DomainError):
    """Re-drive and resolve are staff acts (``payments.redrive_scheduledpayment``)."""

    code = "permission_denied"
    default_detail = "Re-driving or resolving a payment needs the payments.redrive_scheduledpayment permission."


class VersionMismatch(DomainError):
    code = "version_mismatch"

    def __init__(self, version: int):
        super().__init__("The payment changed since you read it (If-Match does not match).", version=version)
        self.version = version


class RecurringNotFound(DomainError):
    code = "not_found"
    default_detail = "No such recurring payment."


class RecurringStateError(DomainError):
    code = "recurring_not_editable"

    def __init__(self, status: str):
        super().__init__(f"The recurring payment is {status}.", status=status)
        self.status = status


class IdempotencyKeyReused(DomainError):
    code = "idempotency_key_reused"
    default_detail = "This Idempotency-Key was already used with a different request."


class IdempotencyKeyInUse(DomainError):
    code = "idempotency_key_in_use"
    default_detail = "A request with this Idempotency-Key is still in progress; retry shortly."


class StaffActionForbidden(DomainError):
    """Staff may read everything, but act on another user's payment or recurring payment
    only with the permission for that action (superusers have them all)."""

    code = "permission_denied"
    default_detail = "You may read this but not do that to it."


class PaymentCancelForbidden(StaffActionForbidden):
    default_detail = "You may read this payment but not cancel it."


class IdempotencyKeyRequired(DomainError):
    code = "idempotency_key_required"
    default_detail = "This request needs an Idempotency-Key header."


class IdempotencyKeyInvalid(DomainError):
    code = "idempotency_key_invalid"
    default_detail = "Idempotency-Key must be 1 to 255 printable ASCII characters, bare or in double quotes."


class IdempotencyKeyRepeated(DomainError):
    # WSGI joins a header sent twice with ","; a bare key with a comma cannot be told apart.
    code = "idempotency_key_repeated"
    default_detail = (
        "Send one Idempotency-Key header with one key; a bare key may not contain a comma "
        "(two headers arrive joined by one)."
    )


class InvalidCredentials(DomainError):
    code = "invalid_credentials"
    default_detail = "Unable to log in with the given username and password."


class SystemAccountPayee(DomainError):
    """A payment or recurring payment into a system account (the issuance account): money
    enters the system through deposits and never flows back by a payment."""

    code = "system_account"
    default_detail = "Payments to a system account are refused: pay a user account."


# Per-user limits (payments/limits.py). Each carries ``limit`` (the cap) and ``usage``
# (where the user stands before this request); the daily one also ``requested`` and ``day``.


class PendingPaymentsLimit(DomainError):
    code = "limit_pending_payments"


class ActiveSeriesLimit(DomainError):
    code = "limit_active_series"


class DailyOutflowLimit(DomainError):
    code = "limit_daily_outflow"


class PayeeNotFound(DomainError):
    code = "not_found"
    default_detail = "No such payee."


class PayeeDeleteForbidden(StaffActionForbidden):
    """Staff may read every payee (``payments.view_payee``), but only its owner deletes one."""

    default_detail = "You may read this payee but only its owner may delete it."


class PayeeInUse(DomainError):
    """Delete of a payee with payouts (or series) still pending."""

    code = "payee_in_use"

    def __init__(self, pending: int):
        super().__init__(
            f"{pending} payouts or recurring payments to this payee are still pending: cancel them, or wait.",
            pending=pending,
        )


class PayoutOutcomeUnknown(DomainError):
    """Cancel of a payout whose funds are reserved at its rail: the rail may have paid it."""

    code = "payout_outcome_unknown"

    def __init__(self, status: str):
        super().__init__(
            f"The payout is {status} with its funds reserved and its outcome at the rail unknown: it cannot be "
            "cancelled until the rail has answered.", status=status,
        )
        self.status = status


class PayoutPaidAtRail(DomainError):
    """Resolve-as-failed of a parked payout that its rail says it paid."""

    code = "payout_paid_at_rail"

    def __init__(self, reference: str):
        super().__init__(
            f"The rail paid this payout ({reference}): re-drive it, and it will be recorded as executed.",
            reference=reference,
        )


class RailUnavailable(DomainError):
    """The rail did not answer a lookup that an action needs (503)."""

    code = "rail_unavailable"
    default_detail = "The payment rail did not answer; try again later."
