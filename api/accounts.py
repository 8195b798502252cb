"""Accounts: list, open, read; deposits (staff); an account's payments and transfers."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from api import serializers as s
from api.base import ACCOUNT_ORDER, PAYMENT_ORDER, TRANSFER_ORDER, ApiView, needs_permission, render
from api.idempotency import run_idempotent
from api.pagination import paginated_response
from api.schema import IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, READ, RETRY_AFTER, WRITE, WWW_AUTHENTICATE, errors, page_of
from api.throttling import CreateThrottle
from ledger.models import Account
from ledger.selectors import account_visible_to, transfer_list_for_account
from ledger.services import account_create, account_deposit_check, deposit_submit
from payments.exceptions import AccountNotFound
from payments.selectors import payment_list_for_account


def visible_account(request, account_id: str) -> Account:
    """The account if the caller may read it (someone else's: staff with ledger.view_account,
    for a deposit too), else AccountNotFound: existence is not revealed."""
    account = account_visible_to(user=request.user).select_related("owner").filter(pk=account_id).first()
    if account is None:
        raise AccountNotFound()
    return account


# Money enters the system only by staff holding ledger.deposit_account: the same permission
# the admin's deposit form asks for (a read-only auditor has none).
CanDeposit = needs_permission("ledger.deposit_account", "Depositing needs the ledger.deposit_account permission.")


class AccountListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="accounts_list",
        tags=["accounts"],
        summary="Your accounts, newest first (staff with ledger.view_account: every account)",
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
        summary="One of your accounts (staff with ledger.view_account: any)",
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.AccountSerializer, **errors(*READ, 404)},
    )
    def get(self, request, account_id: str):
        return Response(s.AccountSerializer(visible_account(request, account_id)).data)


class DepositView(ApiView):
    permission_classes = [CanDeposit]
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="accounts_deposits_create",
        tags=["accounts"],
        summary="Credit a user account from the issuance account (staff with ledger.deposit_account)",
        description=(
            "Money enters the system here, with your user and `reason` recorded in the same transaction (a "
            "`deposit` staff action). It is deposited at once (201 with the deposit) when it is at most "
            "DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD units, into an account you do not own, and your deposits made "
            "without a second person in the last DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS, and those into the "
            "account owner's accounts, stay within the threshold with it. Otherwise nothing moves yet: 202 with "
            "a pending deposit request (`why` says which rule) that another staff member with "
            "ledger.approve_deposit, not the account's owner, approves (`POST /deposit-requests/{id}/approve`, "
            "then the money moves) or rejects. Deposits into system accounts are 409 deposit_rejected before "
            "the Idempotency-Key or the body is read; into a closed account, 409 deposit_rejected."
        ),
        request=s.DepositCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(s.DepositSerializer, description="Deposited (or a replay of the first response)."),
            202: OpenApiResponse(
                s.DepositRequestSerializer,
                description="Above the approval threshold: a pending deposit request (or a replay of it).",
            ),
            **errors(*WRITE, 403, 404, 409, 429, e403="permission_denied: needs ledger.deposit_account."),
        },
    )
    def post(self, request, account_id: str):
        account = visible_account(request, account_id)
        # A system account is refused before the Idempotency-Key and the body are read.
        account_deposit_check(account=account)

        def create():
            body = s.DepositCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            submission = deposit_submit(
                account_id=account.id, actor=request.user, amount=body.validated_data["amount"],
                reason=body.validated_data["reason"],
            )
            if submission.request is not None:
                return 202, render(s.DepositRequestSerializer(submission.request).data)
            deposit = submission.deposit
            data = {
                "deposit_id": deposit.key,
                "account_id": deposit.account_id,
                "amount": deposit.amount,
                "balance": deposit.balance,
                "created_at": deposit.posted_at,
            }
            return 201, render(s.DepositSerializer(data).data)

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
        transfers = transfer_list_for_account(user=request.user, account=account)
        return paginated_response(request, transfers, s.TransferSerializer, ordering=TRANSFER_ORDER)
