"""Payments: schedule, list, read, reschedule or change the amount, cancel; staff
re-drive or resolve a payment in review."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response

from api import serializers as s
from api.base import PAYMENT_ORDER, ApiView, render
from api.idempotency import run_idempotent
from api.pagination import paginated_response
from api.preconditions import expected_version, with_etag
from api.schema import (
    ETAG,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    IF_MATCH,
    READ,
    RETRY_AFTER,
    WRITE,
    WWW_AUTHENTICATE,
    errors,
    page_of,
)
from api.throttling import CreateThrottle
from payments.selectors import payment_authorize, payment_get, payment_is_own, payment_list
from payments.services import (
    payment_cancel,
    payment_cancel_by_staff,
    payment_redrive,
    payment_resolve,
    payment_schedule,
    payment_update,
)


class PaymentListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="payments_list",
        tags=["payments"],
        summary="Your payments, newest due first (staff with payments.view_scheduledpayment: every payment)",
        parameters=[s.PaymentPageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.PaymentSerializer, "PaymentPage"), **errors(400, *READ)},
    )
    def get(self, request):
        query = s.PaymentPageQuerySerializer.parse(request)
        payments = payment_list(user=request.user, status=query.get("status"))
        return paginated_response(request, payments, s.PaymentSerializer, ordering=PAYMENT_ORDER)

    @extend_schema(
        operation_id="payments_create",
        tags=["payments"],
        summary="Schedule a payment",
        description=(
            "Records a transfer to run at `execute_at`. Funds are **not** checked now: the balance "
            "at execution time decides, and a payment the account cannot cover then ends FAILED "
            "with failure_reason `insufficient_funds`. Optional `jitter_seconds` spreads the due time "
            "(both times are returned); optional `expires_after` fails the payment as `expired` instead "
            "of running it late after an outage."
        ),
        request=s.PaymentCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(s.PaymentSerializer, description="Scheduled (or a replay of the first response)."),
            **errors(*WRITE, 409, 429, e409="idempotency_key_reused or idempotency_key_in_use; "
                     "limit_pending_payments or limit_daily_outflow: a per-user limit leaves no room."),
        },
    )
    def post(self, request):
        def create():
            body = s.PaymentCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            data = body.validated_data
            payment = payment_schedule(
                payer=request.user,
                from_account_id=data["from_account"],
                to_account_id=data.get("to_account"),
                to_payee_id=data.get("to_payee"),
                amount=data["amount"],
                execute_at=data["execute_at"],
                jitter_seconds=data.get("jitter_seconds", 0),
                expires_after=data.get("expires_after"),
            )
            return 201, render(s.PaymentSerializer(payment).data)

        return run_idempotent(request, create)


def payment_expected_version(request, payment_id: str) -> int | None:
    """The version If-Match asks a write to find (None without If-Match)."""
    return expected_version(request, current=lambda: payment_get(user=request.user, payment_id=payment_id).version)


def payment_response(request, payment_id: str) -> Response:
    """The payment as the caller may see it, with its version as the ETag."""
    payment = payment_get(user=request.user, payment_id=payment_id)
    return with_etag(Response(s.PaymentSerializer(payment).data), payment.version)


class PaymentDetailView(ApiView):
    @extend_schema(
        operation_id="payments_retrieve",
        tags=["payments"],
        summary="A payment with its status, failure_reason and attempts",
        parameters=[ETAG, WWW_AUTHENTICATE],
        responses={200: s.PaymentSerializer, **errors(*READ, 404, 410)},
    )
    def get(self, request, payment_id: str):
        return payment_response(request, payment_id)

    @extend_schema(
        operation_id="payments_update",
        tags=["payments"],
        summary="Reschedule a payment or change its amount while it is SCHEDULED",
        description=(
            "`execute_at` and/or `amount`, validated as on create; a new `execute_at` gets a new jitter draw "
            "if the payment has `jitter_seconds`. A compare-and-set from SCHEDULED that bumps `version` and "
            "records the old and new values in the payment's history. With `If-Match` it is optimistic: 412 "
            "version_mismatch if the payment changed since you read it. 409 payment_not_editable once it was "
            "claimed for execution or finished. Sending the values the payment already has changes nothing "
            "and answers 200, so a retry is safe."
        ),
        request=s.PaymentUpdateSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={
            200: s.PaymentSerializer,
            **errors(
                *WRITE, 403, 404, 409, 412,
                e403="permission_denied: staff need payments.change_scheduledpayment to change others' payments.",
                e409="payment_not_editable; `status` is the payment's current status. limit_daily_outflow: "
                "the new amount or day would pass the per-user daily limit.",
            ),
        },
    )
    def patch(self, request, payment_id: str):
        payment_authorize(user=request.user, payment_id=payment_id, act="change")
        body = s.PaymentUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        expected = payment_expected_version(request, payment_id)
        payment_update(payment_id=payment_id, actor=request.user, expected_version=expected, **body.validated_data)
        return payment_response(request, payment_id)

    @extend_schema(
        operation_id="payments_cancel",
        tags=["payments"],
        summary="Cancel a scheduled payment (or one in review)",
        description=(
            "200 with the CANCELLED payment, also when it was already cancelled. A payment parked in "
            "NEEDS_REVIEW can be cancelled too. 409 payment_not_cancellable (with its `status`) once it was "
            "claimed for execution or finished. With `If-Match` it is optimistic: 412 version_mismatch if the "
            "payment changed since you read it; a retried cancel that already took effect answers 200. Staff "
            "cancelling someone else's payment give a `reason` (query parameter, required): it is recorded with "
            "their user in the ledger's staff actions, in the cancel's transaction."
        ),
        parameters=[s.PaymentCancelQuerySerializer, IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={
            200: s.PaymentSerializer,
            **errors(
                400, *READ, 403, 404, 409, 412,
                e400="validation_error: If-Match is not entity tags, or a staff cancel without `reason`.",
                e403="permission_denied: staff without the cancel permission may read but not cancel.",
                e409="payment_not_cancellable; `status` is the payment's current status (EXECUTING for a claimed "
                "payment, a payout included). payout_outcome_unknown: a payout in NEEDS_REVIEW (or re-driven to "
                "SCHEDULED) whose funds are still reserved at its rail, outcome not yet known.",
            ),
        },
    )
    def delete(self, request, payment_id: str):
        payment_authorize(user=request.user, payment_id=payment_id, act="cancel")
        query = s.PaymentCancelQuerySerializer.parse(request)
        expected = payment_expected_version(request, payment_id)
        if payment_is_own(user=request.user, payment_id=payment_id):
            payment_cancel(payment_id=payment_id, actor=request.user, expected_version=expected)
        else:  # staff cancelling someone else's payment: recorded with an author and a reason
            payment_cancel_by_staff(
                payment_id=payment_id, actor=request.user, reason=query.get("reason", ""), expected_version=expected
            )
        return payment_response(request, payment_id)


REVIEW_ERRORS = {
    "e403": "permission_denied: re-drive and resolve are staff acts that need "
    "payments.redrive_scheduledpayment; the payment's creator or payer without it gets 403 too. "
    "conflict_of_interest: staff holding it who created the payment or own an account or payee it pays from "
    "or to.",
    "e409": "payment_not_in_review; `status` is the payment's current status.",
}


class PaymentRedriveView(ApiView):
    @extend_schema(
        operation_id="payments_redrive",
        tags=["payments"],
        summary="Staff: send a payment in NEEDS_REVIEW through again",
        description=(
            "NEEDS_REVIEW -> SCHEDULED with a fresh retry budget (`tries` back to 0), due at once or at "
            "`execute_at` (shown as `next_attempt_at` until then). A compare-and-set on NEEDS_REVIEW, recorded "
            "as a `redriven` event with your user and `reason`. Repeating it after it took effect changes "
            "nothing and answers 200 with the payment as it is now, so no Idempotency-Key is needed. 409 "
            "payment_not_in_review for a payment that is not (and was not) in review."
        ),
        request=s.PaymentRedriveSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.PaymentSerializer, **errors(*WRITE, 403, 404, 409, 412, **REVIEW_ERRORS)},
    )
    def post(self, request, payment_id: str):
        payment_authorize(user=request.user, payment_id=payment_id, act="review")
        body = s.PaymentRedriveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        payment_redrive(
            payment_id=payment_id,
            actor=request.user,
            reason=body.validated_data["reason"],
            execute_at=body.validated_data.get("execute_at"),
            expected_version=payment_expected_version(request, payment_id),
        )
        return payment_response(request, payment_id)


class PaymentResolveView(ApiView):
    @extend_schema(
        operation_id="payments_resolve",
        tags=["payments"],
        summary="Staff: close a payment in NEEDS_REVIEW as failed",
        description=(
            "NEEDS_REVIEW -> FAILED with failure_reason `resolved_by_staff`; nothing moves. `outcome` must be "
            "`failed`. A compare-and-set on NEEDS_REVIEW, recorded as a `failed` event with your user and "
            "`reason`. Repeating it answers 200 with the payment unchanged, so no Idempotency-Key is needed. "
            "409 payment_not_in_review for a payment that is not (and was not) in review. A payout whose "
            "funds are reserved is looked up at its rail first: nothing there, its funds are voided back to "
            "the payer; paid there, 409 payout_paid_at_rail (re-drive it instead); no answer, 503 "
            "rail_unavailable."
        ),
        request=s.PaymentResolveSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.PaymentSerializer, **errors(*WRITE, 403, 404, 409, 412, **REVIEW_ERRORS)},
    )
    def post(self, request, payment_id: str):
        payment_authorize(user=request.user, payment_id=payment_id, act="review")
        body = s.PaymentResolveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        payment_resolve(
            payment_id=payment_id,
            actor=request.user,
            outcome=body.validated_data["outcome"],
            reason=body.validated_data["reason"],
            expected_version=payment_expected_version(request, payment_id),
        )
        return payment_response(request, payment_id)
