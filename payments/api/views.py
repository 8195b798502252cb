"""HTTP views: parse, call one service or selector, render. Business rules live in the
services; who may see what lives in the selectors; the OpenAPI description of each
operation sits on its method."""

from django.conf import settings
from django.contrib.auth import authenticate
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from delaypay.ids import new_id
from ledger.models import Account
from ledger.selectors import account_visible_to, transfers_for_account
from ledger.services import Outcome, account_create, ledger_deposit
from payments.exceptions import AccountNotFound, DepositRejected, InvalidCredentials
from payments.models import RecurringPayment
from payments.recurring import recurring_create, recurring_end, recurring_pause, recurring_resume, recurring_update
from payments.selectors import (
    payment_authorize_cancel,
    payment_authorize_update,
    payment_get,
    payment_list,
    payment_list_for_account,
    recurring_authorize,
    recurring_get,
    recurring_list,
    recurring_occurrences,
)
from payments.services import payment_cancel, payment_schedule, payment_update

from . import serializers as s
from .idempotency import run_idempotent
from .pagination import keyset_page, paginated_response
from .preconditions import expected_version, with_etag
from .schema import (
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
from .throttling import CreateThrottle, ScopedThrottle

# Newest first everywhere; the last field makes every ordering unique (cursor-stable).
PAYMENT_ORDER = ("-execute_at", "-id")
ACCOUNT_ORDER = ("-created_at", "-id")
TRANSFER_ORDER = ("-id",)
RECURRING_ORDER = ("-created_at", "-id")
OCCURRENCE_ORDER = ("-occurrence_at", "-id")


def render(data) -> str:
    return JSONRenderer().render(data).decode()


def visible_account(request, account_id: str) -> Account:
    account = account_visible_to(user=request.user).select_related("owner").filter(pk=account_id).first()
    if account is None:
        raise AccountNotFound()
    return account


class ApiView(APIView):
    """No OPTIONS self-description (the OpenAPI schema is the description): OPTIONS is
    405 and absent from Allow."""

    http_method_names = ["get", "post", "patch", "delete", "head"]


class IsStaff(BasePermission):
    message = "Only staff can do this."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_staff)


class TokenView(ApiView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"

    @extend_schema(
        operation_id="auth_token_create",
        tags=["auth"],
        summary="Exchange a username and password for an API token",
        request=s.TokenRequestSerializer,
        responses={200: s.TokenResponseSerializer, **errors(400, 406, 413, 415, 429)},
        parameters=[RETRY_AFTER],
        auth=[],
    )
    def post(self, request):
        body = s.TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = authenticate(request, **body.validated_data)
        if user is None or not user.is_active:
            raise InvalidCredentials()
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})


class AccountListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="accounts_list",
        tags=["accounts"],
        summary="Your accounts, newest first (staff: every account)",
        parameters=[s.PageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.AccountSerializer, "AccountPage"), **errors(400, *READ)},
    )
    def get(self, request):
        s.PageQuerySerializer.parse(request)
        accounts = account_visible_to(user=request.user).select_related("owner")
        return paginated_response(request, accounts, s.AccountSerializer, ordering=ACCOUNT_ORDER)

    @extend_schema(
        operation_id="accounts_create",
        tags=["accounts"],
        summary="Open an empty account owned by you",
        request=s.AccountCreateSerializer,
        responses={201: s.AccountSerializer, **errors(*WRITE, 429)},
        parameters=[RETRY_AFTER, WWW_AUTHENTICATE],
    )
    def post(self, request):
        body = s.AccountCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        account = account_create(owner=request.user, name=body.validated_data["name"])
        account.refresh_from_db()
        return Response(s.AccountSerializer(account).data, status=status.HTTP_201_CREATED)


class AccountDetailView(ApiView):
    @extend_schema(
        operation_id="accounts_retrieve",
        tags=["accounts"],
        summary="One of your accounts (staff: any)",
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.AccountSerializer, **errors(*READ, 404)},
    )
    def get(self, request, account_id: str):
        return Response(s.AccountSerializer(visible_account(request, account_id)).data)


class DepositView(ApiView):
    permission_classes = [IsStaff]
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="accounts_deposits_create",
        tags=["accounts"],
        summary="Credit a user account from the issuance account (staff only)",
        request=s.DepositCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(s.DepositSerializer, description="Deposited (or a replay of the first response)."),
            **errors(*WRITE, 403, 404, 409, 429, e403="permission_denied: only staff can deposit."),
        },
    )
    def post(self, request, account_id: str):
        account = visible_account(request, account_id)
        if account.kind != Account.Kind.USER:
            raise DepositRejected("Deposits go to user accounts only.")

        def create():
            body = s.DepositCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            amount = body.validated_data["amount"]
            key = new_id("dep")
            with transaction.atomic():
                result = ledger_deposit(key=key, account_id=account.id, amount=amount)
                if result.outcome != Outcome.APPLIED:
                    raise DepositRejected(f"The deposit was rejected: {result.outcome.value}.")
                account.refresh_from_db()
            deposit = {
                "deposit_id": key,
                "account_id": account.id,
                "amount": amount,
                "balance": account.balance,
                "created_at": result.posted_at,
            }
            return 201, render(s.DepositSerializer(deposit).data)

        return run_idempotent(request, create)


class AccountPaymentListView(ApiView):
    @extend_schema(
        operation_id="accounts_payments_list",
        tags=["accounts"],
        summary="Payments you may see that debit or credit this account, newest due first",
        parameters=[s.PaymentPageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.PaymentSerializer, "PaymentPage"), **errors(400, *READ, 404)},
    )
    def get(self, request, account_id: str):
        query = s.PaymentPageQuerySerializer.parse(request)
        account = visible_account(request, account_id)
        payments = payment_list_for_account(user=request.user, account_id=account.id, status=query.get("status"))
        return paginated_response(request, payments, s.PaymentSerializer, ordering=PAYMENT_ORDER)


class AccountTransferListView(ApiView):
    @extend_schema(
        operation_id="accounts_transfers_list",
        tags=["accounts"],
        summary="The account's ledger history, newest first",
        parameters=[s.PageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.TransferSerializer, "TransferPage"), **errors(400, *READ, 404)},
    )
    def get(self, request, account_id: str):
        s.PageQuerySerializer.parse(request)
        account = visible_account(request, account_id)
        transfers = transfers_for_account(account_id=account.id)
        return paginated_response(request, transfers, s.TransferSerializer, ordering=TRANSFER_ORDER)


class PaymentListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="payments_list",
        tags=["payments"],
        summary="Your payments, newest due first (staff: every payment)",
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
            **errors(*WRITE, 409, 429, e409="idempotency_key_reused or idempotency_key_in_use."),
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
                to_account_id=data["to_account"],
                amount=data["amount"],
                execute_at=data["execute_at"],
                jitter_seconds=data.get("jitter_seconds", 0),
                expires_after=data.get("expires_after"),
            )
            return 201, render(s.PaymentSerializer(payment).data)

        return run_idempotent(request, create)


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
        responses={200: s.PaymentSerializer, **errors(*READ, 404)},
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
                e409="payment_not_editable; `status` is the payment's current status.",
            ),
        },
    )
    def patch(self, request, payment_id: str):
        payment_authorize_update(user=request.user, payment_id=payment_id)
        body = s.PaymentUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        expected = expected_version(
            request, current=lambda: payment_get(user=request.user, payment_id=payment_id).version
        )
        payment_update(payment_id=payment_id, actor=request.user, expected_version=expected, **body.validated_data)
        return payment_response(request, payment_id)

    @extend_schema(
        operation_id="payments_cancel",
        tags=["payments"],
        summary="Cancel a scheduled payment",
        description=(
            "200 with the CANCELLED payment, also when it was already cancelled. 409 "
            "payment_not_cancellable (with its `status`) once it was claimed for execution or finished."
        ),
        parameters=[ETAG, WWW_AUTHENTICATE],
        responses={
            200: s.PaymentSerializer,
            **errors(
                *READ, 403, 404, 409,
                e403="permission_denied: staff without the cancel permission may read but not cancel.",
                e409="payment_not_cancellable; `status` is the payment's current status.",
            ),
        },
    )
    def delete(self, request, payment_id: str):
        payment_authorize_cancel(user=request.user, payment_id=payment_id)
        payment_cancel(payment_id=payment_id, actor=request.user)
        return payment_response(request, payment_id)


# --- recurring payments ------------------------------------------------------------------


def recurring_body(rec: RecurringPayment, *, page_request=None) -> dict:
    """The recurring payment with a page of its occurrences, newest first (the page the
    request's cursor and limit select; the first page without one)."""
    occurrences = keyset_page(
        recurring_occurrences(recurring_id=rec.id), s.OccurrenceSerializer, ordering=OCCURRENCE_ORDER,
        request=page_request,
    )
    return s.RecurringPaymentDetailSerializer(rec, context={"occurrences": occurrences}).data


def recurring_response(request, recurring_id: str, *, page_request=None) -> Response:
    rec = recurring_get(user=request.user, recurring_id=recurring_id)
    return with_etag(Response(recurring_body(rec, page_request=page_request)), rec.version)


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
        summary="Your recurring payments, newest first (staff: every one)",
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
            "(DELAYPAY_MIN_RECURRING_INTERVAL)."
        ),
        request=s.RecurringCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(
                s.RecurringPaymentDetailSerializer, description="Created, ACTIVE (or a replay of the first response)."
            ),
            **errors(*WRITE, 409, 429, e409="idempotency_key_reused or idempotency_key_in_use."),
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
                to_account_id=data["to_account"],
                amount=data["amount"],
                start_at=data["start_at"],
                interval=data.get("interval", ""),
                cron=data.get("cron", ""),
                timezone=data.get("timezone", "UTC"),
                end_at=data.get("end_at"),
                count=data.get("count"),
            )
            return 201, render(recurring_body(rec))

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
            "(null clears end_at or count). The occurrence already scheduled is cancelled and replaced by the "
            "first occurrence after now under the new terms (a paused series gets it when resumed); payments "
            "already claimed or finished are not touched. Bumps `version`; `If-Match` makes it optimistic. "
            "Sending the values it already has changes nothing and answers 200."
        ),
        request=s.RecurringUpdateSerializer,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(*WRITE, 403, 404, 409, 412,
                                                                      **RECURRING_WRITE_ERRORS)},
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
            "PAUSED -> ACTIVE; the next occurrence is the first one after now. Resuming an active series "
            "answers 200 again. 409 once it has ENDED."
        ),
        request=None,
        parameters=[IF_MATCH, ETAG, WWW_AUTHENTICATE],
        responses={200: s.RecurringPaymentDetailSerializer, **errors(400, *READ, 403, 404, 409, 412,
                                                                      **RECURRING_WRITE_ERRORS)},
    )
    def post(self, request, recurring_id: str):
        return recurring_transition(request, recurring_id, action="pause", service=recurring_resume)
