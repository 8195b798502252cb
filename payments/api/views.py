"""HTTP views: parse, call one service, render. Business rules live in services."""

import re

from django.contrib.auth import authenticate
from django.db import transaction
from django.http import HttpResponse
from rest_framework import status
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from delaypay.ids import new_id
from ledger.models import Account
from ledger.selectors import account_visible_to
from ledger.services import Outcome, account_create, ledger_deposit
from payments.exceptions import AccountNotFound, DepositRejected, DomainError
from payments.idempotency import StoredResponse, idempotent_call, request_fingerprint
from payments.selectors import payment_get
from payments.services import payment_cancel, payment_schedule

from . import serializers as s

# 1-255 printable ASCII characters, bare or as a quoted string (the IETF draft's sf-string).
_KEY_RE = re.compile(r'^"?([\x20-\x21\x23-\x7e]{1,255})"?$')


class IdempotencyKeyRequired(DomainError):
    code = "idempotency_key_required"
    default_detail = "This request needs an Idempotency-Key header."


class IdempotencyKeyInvalid(DomainError):
    code = "idempotency_key_invalid"
    default_detail = "Idempotency-Key must be 1 to 255 printable ASCII characters."


class InvalidCredentials(DomainError):
    code = "invalid_credentials"
    default_detail = "Unable to log in with the given username and password."


def idempotency_key(request) -> str:
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        raise IdempotencyKeyRequired()
    raw = raw.strip()
    match = _KEY_RE.match(raw)
    quoted = raw.startswith('"') or raw.endswith('"')
    if not match or (quoted and not (len(raw) >= 3 and raw[0] == raw[-1] == '"')):
        raise IdempotencyKeyInvalid()
    return match.group(1)


def render(data) -> str:
    return JSONRenderer().render(data).decode()


def stored_response(stored: StoredResponse) -> HttpResponse:
    """The stored body byte-for-byte, first time and on every replay."""
    response = HttpResponse(stored.body, status=stored.status, content_type="application/json")
    if stored.replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def run_idempotent(request, create) -> HttpResponse:
    key = idempotency_key(request)
    fingerprint = request_fingerprint(method=request.method, path=request.path, body=request.data)
    return stored_response(idempotent_call(actor=request.user, key=key, fingerprint=fingerprint, create=create))


class TokenView(APIView):
    """Exchange a username and password for an API token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request):
        body = s.TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = authenticate(request, **body.validated_data)
        if user is None or not user.is_active:
            raise InvalidCredentials()
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})


class AccountListCreateView(APIView):
    def get(self, request):
        accounts = account_visible_to(user=request.user).select_related("owner").order_by("created_at", "id")
        return Response({"items": s.AccountSerializer(accounts, many=True).data, "next_cursor": None})

    def post(self, request):
        body = s.AccountCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        account = account_create(owner=request.user, name=body.validated_data["name"])
        account.refresh_from_db()
        return Response(s.AccountSerializer(account).data, status=status.HTTP_201_CREATED)


def visible_account(request, account_id: str) -> Account:
    account = account_visible_to(user=request.user).select_related("owner").filter(pk=account_id).first()
    if account is None:
        raise AccountNotFound()
    return account


class AccountDetailView(APIView):
    def get(self, request, account_id: str):
        return Response(s.AccountSerializer(visible_account(request, account_id)).data)


class DepositView(APIView):
    """Staff credit a user account from the issuance account."""

    def post(self, request, account_id: str):
        if not request.user.is_staff:
            raise PermissionDenied("Only staff can deposit.")
        account = visible_account(request, account_id)
        if account.kind != Account.Kind.USER:
            raise DepositRejected("Deposits go to user accounts only.")

        def create():
            body = s.DepositCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            key = new_id("dep")
            with transaction.atomic():
                result = ledger_deposit(key=key, account_id=account.id, amount=body.validated_data["amount"])
                if result.outcome != Outcome.APPLIED:
                    raise DepositRejected(f"The deposit was rejected: {result.outcome.value}.")
                account.refresh_from_db()
            return 201, render(
                {
                    "deposit_id": key,
                    "account_id": account.id,
                    "amount": body.validated_data["amount"],
                    "balance": account.balance,
                    "created_at": s.StrictDateTimeField().to_representation(result.posted_at),
                }
            )

        return run_idempotent(request, create)


class PaymentListCreateView(APIView):
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


class PaymentDetailView(APIView):
    def get(self, request, payment_id: str):
        return Response(s.PaymentSerializer(payment_get(user=request.user, payment_id=payment_id)).data)

    def delete(self, request, payment_id: str):
        payment_get(user=request.user, payment_id=payment_id)  # 404 unless the caller may see it
        payment_cancel(payment_id=payment_id, actor=request.user)
        return Response(s.PaymentSerializer(payment_get(user=request.user, payment_id=payment_id)).data)
