"""One error shape everywhere: ``{"code": "<snake_case>", "detail": "<sentence>", ...}``.

Domain exceptions and DRF's own exceptions are mapped to HTTP here and only here: the
domain raises exceptions with a stable ``code``; ``DOMAIN_STATUSES`` gives each its status.
"""

import logging
import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from api.authentication import LoginLockedOut
from api.parsers import PayloadTooLarge
from common.authz import ConflictOfInterest
from common.routing import REPLICA, current_routing
from ledger.services import (
    DepositRefused,
    DepositRequestNotFound,
    DepositRequestNotPending,
    ReasonRequired,
    SelfApprovalForbidden,
)
from payments import metrics
from payments.exceptions import (
    AccountNotFound,
    ActiveSeriesLimit,
    DailyOutflowLimit,
    DomainError,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    PayeeInUse,
    PayeeNotFound,
    PaymentArchived,
    PaymentNotCancellable,
    PaymentNotEditable,
    PaymentNotFound,
    PaymentNotInReview,
    PaymentReviewForbidden,
    PayoutOutcomeUnknown,
    PayoutPaidAtRail,
    PendingPaymentsLimit,
    RailUnavailable,
    RecurringNotFound,
    RecurringStateError,
    StaffActionForbidden,
    VersionMismatch,
)
from webhooks.exceptions import DeliveryNotFound, EndpointLimit, EndpointNotFound

logger = logging.getLogger(__name__)

# Seconds a client waits before retrying a request the database could not serve: a
# restart or a failover is over in seconds, a deadlock's victim can go again at once.
DATABASE_RETRY_AFTER = 2

# Every code a client can see, with when. The OpenAPI schema publishes this as the
# Error schema's enum; tests check that every code the code base raises is listed here.
ERROR_CODES: dict[str, str] = {
    "validation_error": "The body, query or a header (If-Match) failed validation; `fields` says which and why.",
    "parse_error": "The body is not valid JSON (or has duplicate keys).",
    "not_authenticated": "No token, or an invalid one (401).",
    "invalid_credentials": "Wrong username or password at /auth/token.",
    "permission_denied": "Authenticated but not allowed (403), e.g. a deposit by a non-staff user.",
    "not_found": "No such resource, or not yours to see (404: existence is not revealed).",
    "payment_archived": "The payment id falls in a month that was archived (DELAYPAY_RETENTION_DAYS): its record "
    "left the database (410; `archived_month` says which).",
    "method_not_allowed": "The path exists but not with this method (405).",
    "not_acceptable": "The Accept header excludes application/json (406).",
    "unsupported_media_type": "The body is not application/json (415).",
    "payload_too_large": "The body is over 64 KiB (413), whether sent with a Content-Length or chunked.",
    "throttled": "Too many requests; `retry_after` and the Retry-After header say when to retry (429).",
    "login_locked_out": "Too many failed logins for this username from this address at /auth/token (429); "
    "`retry_after` and the Retry-After header say when to retry.",
    "idempotency_key_required": "POST without an Idempotency-Key header.",
    "idempotency_key_invalid": "The Idempotency-Key is not 1-255 printable ASCII characters.",
    "idempotency_key_repeated": "More than one Idempotency-Key header (or a bare key with a comma, which is how "
    "two headers arrive).",
    "idempotency_key_reused": "The Idempotency-Key was used before with a different request (409).",
    "idempotency_key_in_use": "A request with this Idempotency-Key is still running; retry (409).",
    "payment_not_cancellable": "The payment was already claimed or finished; `status` says which (409).",
    "payment_not_editable": "PATCH on a payment already claimed or finished; `status` says which (409).",
    "payee_in_use": "DELETE of a payee with payouts or recurring payments to it still pending (409); `pending` "
    "says how many.",
    "payout_outcome_unknown": "Cancel of a payout in NEEDS_REVIEW (or re-driven to SCHEDULED) whose funds are still "
    "reserved at its rail, outcome not yet known (409).",
    "payout_paid_at_rail": "Resolve as failed of a parked payout its rail paid: re-drive it instead (409).",
    "rail_unavailable": "The payment rail did not answer a lookup the action needs; try again later (503).",
    "database_unavailable": "The database did not answer (restarting, failing over) or rolled the request back "
    "(a deadlock, a serialization failure): nothing was changed; retry after `retry_after` seconds, a write "
    "with the same Idempotency-Key (503).",
    "payment_not_in_review": "Re-drive or resolve of a payment not in NEEDS_REVIEW; `status` says what it is (409).",
    "version_mismatch": "If-Match names a version other than the current one, given in `version` (412).",
    "recurring_not_editable": "The recurring payment has ENDED and can no longer change (409); `status` says so.",
    "deposit_rejected": "The ledger refused the deposit, e.g. the account is closed (409).",
    "self_approval_forbidden": "You requested this deposit: another staff member must approve or reject it (403).",
    "conflict_of_interest": "A staff act you would benefit from (403): approving a deposit into an account you own, "
    "freezing or unfreezing your own account, re-driving or resolving a payment you created or are a party to. "
    "Another staff member must do it.",
    "deposit_request_not_pending": "Approve of a rejected deposit request, or reject of an approved one; `status` "
    "says which (409).",
    "system_account": "The payee is a system account (the issuance account): payments go to user accounts only "
    "(400).",
    "limit_pending_payments": "You have DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER pending one-off payments (409); "
    "`limit` and `usage` say so. Cancel one or let one execute.",
    "limit_active_series": "You have DELAYPAY_MAX_ACTIVE_SERIES_PER_USER active or paused recurring payments (409); "
    "`limit` and `usage` say so. End one first.",
    "limit_daily_outflow": "The change would put more than DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER units due on one UTC "
    "day (409): `usage` is already counted on `day`, `requested` what this adds, `limit` the cap.",
    "limit_webhook_endpoints": "You have the most webhook endpoints one user may have (409); `limit` and `usage` "
    "say so. Delete one first.",
    "bad_request": "A request Django or the HTTP server refused, e.g. an unknown Host header, a malformed "
    "request line, a control character in a header, a bad chunk (400).",
    # The HTTP server in front (gunicorn, delaypay/gunicorn_config.py) answers these itself,
    # before Django sees the request.
    "uri_too_long": "The request line (method, path and query) is over 4094 bytes (414, from the server).",
    "header_too_large": "A header over 8190 bytes, or more than 100 headers (431, from the server).",
    "expectation_failed": "An Expect header other than 100-continue (417, from the server).",
    "not_implemented": "A Transfer-Encoding the server does not implement (501, from the server).",
    "server_error": "A bug on our side (500); the request may be retried with the same Idempotency-Key.",
}

ERROR_CODE_CHOICES = list(ERROR_CODES.items())

# Domain exception -> HTTP status, the first isinstance match wins: most specific first.
DOMAIN_STATUSES: list[tuple[type[Exception], int]] = [
    (StaffActionForbidden, status.HTTP_403_FORBIDDEN),  # and PaymentCancelForbidden
    (PaymentReviewForbidden, status.HTTP_403_FORBIDDEN),
    (PaymentArchived, status.HTTP_410_GONE),  # before PaymentNotFound, its base
    (PaymentNotFound, status.HTTP_404_NOT_FOUND),
    (AccountNotFound, status.HTTP_404_NOT_FOUND),
    (RecurringNotFound, status.HTTP_404_NOT_FOUND),
    (EndpointNotFound, status.HTTP_404_NOT_FOUND),
    (DeliveryNotFound, status.HTTP_404_NOT_FOUND),
    (PayeeNotFound, status.HTTP_404_NOT_FOUND),
    (PayeeInUse, status.HTTP_409_CONFLICT),
    (PayoutOutcomeUnknown, status.HTTP_409_CONFLICT),
    (PayoutPaidAtRail, status.HTTP_409_CONFLICT),
    (RailUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (PaymentNotCancellable, status.HTTP_409_CONFLICT),
    (PaymentNotEditable, status.HTTP_409_CONFLICT),
    (PaymentNotInReview, status.HTTP_409_CONFLICT),
    (RecurringStateError, status.HTTP_409_CONFLICT),
    (IdempotencyKeyReused, status.HTTP_409_CONFLICT),
    (IdempotencyKeyInUse, status.HTTP_409_CONFLICT),
    (DepositRefused, status.HTTP_409_CONFLICT),
    (SelfApprovalForbidden, status.HTTP_403_FORBIDDEN),
    (ConflictOfInterest, status.HTTP_403_FORBIDDEN),
    (DepositRequestNotFound, status.HTTP_404_NOT_FOUND),
    (DepositRequestNotPending, status.HTTP_409_CONFLICT),
    (ReasonRequired, status.HTTP_400_BAD_REQUEST),
    # Per-user limits: the request is fine, the user's other payments leave no room now.
    (PendingPaymentsLimit, status.HTTP_409_CONFLICT),
    (ActiveSeriesLimit, status.HTTP_409_CONFLICT),
    (DailyOutflowLimit, status.HTTP_409_CONFLICT),
    (EndpointLimit, status.HTTP_409_CONFLICT),
    (VersionMismatch, status.HTTP_412_PRECONDITION_FAILED),
    # Everything else is the client's to fix: validation, a missing or malformed
    # Idempotency-Key, wrong credentials.
    (DomainError, status.HTTP_400_BAD_REQUEST),
]


def domain_status(exc: Exception) -> int | None:
    """The HTTP status of a domain exception; None for anything else."""
    return next((http_status for cls, http_status in DOMAIN_STATUSES if isinstance(exc, cls)), None)


_DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (PayloadTooLarge, "payload_too_large"),
    (LoginLockedOut, "login_locked_out"),  # before Throttled, its base
    (exceptions.NotAuthenticated, "not_authenticated"),
    (exceptions.AuthenticationFailed, "not_authenticated"),
    (exceptions.PermissionDenied, "permission_denied"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.NotAcceptable, "not_acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.Throttled, "throttled"),
    (exceptions.ParseError, "parse_error"),
    (exceptions.ValidationError, "validation_error"),
]


def _flatten(detail):
    """DRF error details -> plain lists of strings per field."""
    if isinstance(detail, dict):
        return {k: _flatten(v) for k, v in detail.items()}
    if isinstance(detail, list):
        if all(not isinstance(d, dict | list) for d in detail):
            return [str(d) for d in detail]
        return [_flatten(d) for d in detail]
    return [str(detail)]


def error_body(code: str, detail: str, **extra) -> dict:
    return {"code": code, "detail": detail, **extra}


def exception_handler(exc, context):
    """DRF EXCEPTION_HANDLER: every error leaves as the one shape."""
    http_status = domain_status(exc)
    if http_status is not None:
        set_rollback()
        # The ledger's DepositRefused has a code and a detail but no extra fields.
        return Response(error_body(exc.code, exc.detail, **getattr(exc, "extra", {})), status=http_status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, RequestDataTooBig):  # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE)
        exc = PayloadTooLarge(settings.DELAYPAY_MAX_BODY_BYTES)
    if isinstance(exc, (OperationalError, InterfaceError)):
        routing = current_routing()
        if routing is not None and routing.database == REPLICA:
            return None  # the read replica failed: the middleware reads it again from the primary
        # Not a bug: the database is down or restarting, or it rolled this request back.
        # The transaction is gone, so nothing was written; the client may retry.
        set_rollback()
        metrics.record_database_unavailable()
        logger.warning("database unavailable", extra={"error": type(exc).__name__, "error_detail": str(exc)[:300]})
        return Response(error_body("database_unavailable", "The database is not available; retry shortly.",
                                   retry_after=DATABASE_RETRY_AFTER),
                        status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": str(DATABASE_RETRY_AFTER)})
    if not isinstance(exc, exceptions.APIException):
        return None  # a real bug: Django's 500 handler answers (JSON, see server_error)
    set_rollback()
    code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), "error")
    headers = {}
    extra = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None) is not None:
        retry_after = max(1, math.ceil(exc.wait))
        headers["Retry-After"] = str(retry_after)
        extra["retry_after"] = retry_after
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        if not isinstance(fields, dict):
            fields = {"non_field_errors": fields}
        body = error_body(code, "Invalid input.", fields=fields)
    else:
        body = error_body(code, str(exc.detail), **extra)
    response = Response(body, status=exc.status_code, headers=headers)
    # DRF drops WWW-Authenticate when status is 403; our 401s keep it.
    if exc.status_code == status.HTTP_401_UNAUTHORIZED and "WWW-Authenticate" not in response:
        response["WWW-Authenticate"] = 'Token realm="api"'
    return response


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


# Django's own error views (urls.py handler404 etc.): JSON under /api/, HTML elsewhere
# so the admin keeps its pages.
def not_found(request, exception=None):
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    return JsonResponse(error_body("not_found", "Not found."), status=404)


def bad_request(request, exception=None):
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):  # Django reports it as a 400; it is a 413
        too_large = PayloadTooLarge(settings.DELAYPAY_MAX_BODY_BYTES)
        return JsonResponse(error_body("payload_too_large", str(too_large.detail)), status=413)
    return JsonResponse(error_body("bad_request", "Bad request."), status=400)


def permission_denied(request, exception=None):
    if not _is_api(request):
        return defaults.permission_denied(request, exception)
    return JsonResponse(error_body("permission_denied", "Permission denied."), status=403)


def server_error(request):
    if not _is_api(request):
        return defaults.server_error(request)
    return JsonResponse(error_body("server_error", "Internal server error."), status=500)
