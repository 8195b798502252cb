"""Recurring payments: create, list, read with a page of occurrences, change, pause,
resume, end."""

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response

from api import serializers as s
from api.base import OCCURRENCE_ORDER, RECURRING_ORDER, ApiView, render
from api.idempotency import run_idempotent
from api.pagination import keyset_page, paginated_response
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
from payments.models import RecurringPayment
from payments.rules import MAX_COUNT, MAX_CRON_COUNT
from payments.selectors import recurring_authorize, recurring_get, recurring_list, recurring_occurrences
from recurring.services import recurring_create, recurring_end, recurring_pause, recurring_resume, recurring_update


def recurring_body(rec: RecurringPayment, *, user, page_request=None) -> dict:
    """The recurring payment with a page of the occurrences ``user`` may see, newest first
    (the page the request's cursor and limit select; the first page without one)."""
    occurrences = keyset_page(
        recurring_occurrences(user=user, recurring_id=rec.id), s.OccurrenceSerializer, ordering=OCCURRENCE_ORDER,
        request=page_request,
    )
    return s.RecurringPaymentDetailSerializer(rec, context={"occurrences": occurrences}).data


def recurring_response(request, recurring_id: str, *, page_request=None) -> Response:
    rec = recurring_get(user=request.user, recurring_id=recurring_id)
    return with_etag(Response(recurring_body(rec, user=request.user, page_request=page_request)), rec.version)


def recurring_expected_version(request, recurring_id: str) -> int | None:
    return expected_version(
        request, current=lambda: recurring_get(user=request.user, recurring_id=recurring_id).version
    )


def recurring_transition(request, recurring_id: str, *, action: str, service) -> Response:
    """Pause, resume or end: authorize the action, honour If-Match, call the service, render."""
    recurring_authorize(user=request.user, recurring_id=recurring_id, action=action)
    expected = recurring_expected_version(request, recurring_id)
    service(recurring_id=recurring_id, actor=request.user, expected_version=expected)
    return recurring_response(request, recurring_id)


RECURRING_WRITE_ERRORS = {
    "e403": "permission_denied: staff need the action's permission to act on others' recurring payments.",
    "e409": "recurring_not_editable: the recurring payment has ENDED (`status`).",
}


class RecurringListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="recurring_payments_list",
        tags=["recurring payments"],
        summary="Your recurring payments, newest first (staff with payments.view_recurringpayment: every one)",
        parameters=[s.RecurringPageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.RecurringPaymentSerializer, "RecurringPaymentPage"), **errors(400, *READ)},
    )
    def get(self, request):
        query = s.RecurringPageQuerySerializer.parse(request)
        recs = recurring_list(user=request.user, status=query.get("status"))
        return paginated_response(request, recs, s.RecurringPaymentSerializer, ordering=RECURRING_ORDER)

    @extend_schema(
        operation_id="recurring_payments_create",
        tags=["recurring payments"],
        summary="Create a recurring payment",
        description=(
            "A rule (`interval` or `cron`, in `timezone`) from `start_at`, optionally until `end_at` and/or for "
            "`count` occurrences. Each occurrence becomes an ordinary payment, generated one ahead: the first "
            "occurrence after now at once (listed in `occurrences`), each next one when the previous falls due. "
            f"Occurrences are at least {settings.DELAYPAY_MIN_RECURRING_INTERVAL} seconds apart "
            "(DELAYPAY_MIN_RECURRING_INTERVAL). Bounds, each a 400 validation_error naming the field: `start_at` "
            "from 1970-01-01T00:00:00Z; an interval of at most 10 years, all of it (P10Y, P120M or P3650D: weeks, "
            "days and time count against the months that years and months leave, at 365 days a year and 28 a "
            "month); a cron expression that matches at least "
            f"once every 366 days; `count` at most {MAX_COUNT} ({MAX_CRON_COUNT} with a cron rule)."
        ),
        request=s.RecurringCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(
                s.RecurringPaymentDetailSerializer, description="Created, ACTIVE (or a replay of the first response)."
            ),
            **errors(*WRITE, 409, 429, e409="idempotency_key_reused or idempotency_key_in_use; "
                     "limit_active_series or limit_daily_outflow: a per-user limit leaves no room."),
        },
    )
    def post(self, request):
        def create():
            body = s.RecurringCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            data = body.validated_data
            rec = recurring_create(
                payer=request.user,
                from_account_id=data["from_account"],
                to_account_id=data.get("to_account"),
                to_payee_id=data.get("to_payee"),
                amount=data["amount"],
                start_at=data["start_at"],
                interval=data.get("interval", ""),
                cron=data.get("cron", ""),
                timezone=data.get("timezone", "UTC"),
                end_at=data.get("end_at"),
                count=data.get("count"),
            )
            return 201, render(recurring_body(rec, user=request.user))

        return run_idempotent(request, create)


class RecurringDetailView(ApiView):
    @extend_schema(
        operation_id="recurring_payments_retrieve",
        tags=["recurring payments"],
        summary="A recurring payment with a page of its occurrences, newest first",
        description=(
            "`occurrences` lists the payments the series generated (cancelled ones too), newest occurrence "
            "first; `cursor` and `limit` page through them (pass `occurrences.next_cursor` as `cursor`)."
        ),
        parameters=[s.PageQuerySerializer, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(400, *READ, 404)},
    )
    def get(self, request, recurring_id: str):
        s.PageQuerySerializer.parse(request)
        return recurring_response(request, recurring_id, page_request=request)

    @extend_schema(
        operation_id="recurring_payments_update",
        tags=["recurring payments"],
        summary="Change the amount or the schedule of future occurrences",
        description=(
            "Any of amount, start_at, interval or cron (one replaces the other), timezone, end_at, count "
            "(null clears end_at or count). The occurrence already scheduled, if not yet due, is cancelled and "
            "replaced by the first occurrence after now under the new terms (a paused series gets it when "
            "resumed); one already due runs as it is, and payments already claimed or finished are not touched. "
            "An occurrence cancelled on its own (DELETE /payments/{id}) stays cancelled: it is never generated "
            "again. Bumps `version`; `If-Match` makes it optimistic. Sending the values it already has changes "
            "nothing and answers 200."
        ),
        request=s.RecurringUpdateSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(
            *WRITE, 403, 404, 409, 412, e403=RECURRING_WRITE_ERRORS["e403"],
            e409=RECURRING_WRITE_ERRORS["e409"] + " limit_daily_outflow: the new terms would pass the per-user "
            "daily limit.",
        )},
    )
    def patch(self, request, recurring_id: str):
        recurring_authorize(user=request.user, recurring_id=recurring_id, action="change")
        body = s.RecurringUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        expected = recurring_expected_version(request, recurring_id)
        recurring_update(recurring_id=recurring_id, actor=request.user, expected_version=expected,
                         **body.validated_data)
        return recurring_response(request, recurring_id)

    @extend_schema(
        operation_id="recurring_payments_end",
        tags=["recurring payments"],
        summary="End a recurring payment for good",
        description=(
            "Status ENDED; the occurrence still SCHEDULED is cancelled (one already claimed runs). "
            "Ending an ended series answers 200 again."
        ),
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(400, *READ, 403, 404, 412,
                                                                      e403=RECURRING_WRITE_ERRORS["e403"])},
    )
    def delete(self, request, recurring_id: str):
        return recurring_transition(request, recurring_id, action="end", service=recurring_end)


class RecurringPauseView(ApiView):
    @extend_schema(
        operation_id="recurring_payments_pause",
        tags=["recurring payments"],
        summary="Pause: no new occurrences, and the scheduled one is cancelled",
        description="ACTIVE -> PAUSED. Pausing a paused series answers 200 again. 409 once it has ENDED.",
        request=None,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(400, *READ, 403, 404, 409, 412,
                                                                      **RECURRING_WRITE_ERRORS)},
    )
    def post(self, request, recurring_id: str):
        return recurring_transition(request, recurring_id, action="pause", service=recurring_pause)


class RecurringResumeView(ApiView):
    @extend_schema(
        operation_id="recurring_payments_resume",
        tags=["recurring payments"],
        summary="Resume from now: missed occurrences are skipped (and recorded), not paid in a burst",
        description=(
            "PAUSED -> ACTIVE; the next occurrence is the first one after now, unless that one was cancelled on "
            "its own (it stays cancelled; the series goes on from the one after it). Resuming an active series "
            "answers 200 again. 409 once it has ENDED."
        ),
        request=None,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(400, *READ, 403, 404, 409, 412,
                                                                      **RECURRING_WRITE_ERRORS)},
    )
    def post(self, request, recurring_id: str):
        return recurring_transition(request, recurring_id, action="pause", service=recurring_resume)
