"""HTTP views: parse, call one service or selector, render. Business rules live in the
services; who may see what lives in the selectors; the OpenAPI description of each
operation sits on its method."""

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
from payments.selectors import payment_authorize_cancel, payment_get, payment_list, payment_list_for_account
from payments.services import payment_cancel, payment_schedule

from . import serializers as s
from .idempotency import run_idempotent
from .pagination import paginated_response
from .schema import (
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
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

    http_method_names = ["get", "post", "delete", "head"]


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
            "with failure_reason `insufficient_funds`."
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
            )
            return 201, render(s.PaymentSerializer(payment).data)

        return run_idempotent(request, create)


class PaymentDetailView(ApiView):
    @extend_schema(
        operation_id="payments_retrieve",
        tags=["payments"],
        summary="A payment with its status, failure_reason and attempts",
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.PaymentSerializer, **errors(*READ, 404)},
    )
    def get(self, request, payment_id: str):
        return Response(s.PaymentSerializer(payment_get(user=request.user, payment_id=payment_id)).data)

    @extend_schema(
        operation_id="payments_cancel",
        tags=["payments"],
        summary="Cancel a scheduled payment",
        description=(
            "200 with the CANCELLED payment, also when it was already cancelled. 409 "
            "payment_not_cancellable (with its `status`) once it was claimed for execution or finished."
        ),
        parameters=[WWW_AUTHENTICATE],
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
        return Response(s.PaymentSerializer(payment_get(user=request.user, payment_id=payment_id)).data)
