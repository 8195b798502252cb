"""Deposit requests: deposits above DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD wait here until a
second staff member approves (the money moves) or rejects them. Four eyes: whoever
requested a deposit may not decide it (403 self_approval_forbidden)."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api import serializers as s
from api.base import ApiView, needs_permission
from api.pagination import paginated_response
from api.schema import READ, WRITE, WWW_AUTHENTICATE, errors, page_of
from ledger.selectors import deposit_request_get, deposit_requests
from ledger.services import DepositRequestNotFound, deposit_request_approve, deposit_request_reject

DEPOSIT_REQUEST_ORDER = ("-created_at", "-id")


CanViewDepositRequests = needs_permission(
    "ledger.view_depositrequest", "Reading deposit requests needs the ledger.view_depositrequest permission."
)
CanApproveDeposits = needs_permission(
    "ledger.approve_deposit", "Approving or rejecting a deposit request needs the ledger.approve_deposit permission."
)


class DepositRequestListView(ApiView):
    permission_classes = [CanViewDepositRequests]

    @extend_schema(
        operation_id="deposit_requests_list",
        tags=["deposit requests"],
        summary="Deposit requests, newest first (staff with ledger.view_depositrequest)",
        parameters=[s.DepositRequestPageQuerySerializer, WWW_AUTHENTICATE],
        responses={
            200: page_of(s.DepositRequestSerializer, "DepositRequestPage"),
            **errors(400, *READ, 403, e403="permission_denied: needs ledger.view_depositrequest."),
        },
    )
    def get(self, request):
        query = s.DepositRequestPageQuerySerializer.parse(request)
        rows = deposit_requests(status=query.get("status"), account_id=query.get("account_id"))
        return paginated_response(request, rows, s.DepositRequestSerializer, ordering=DEPOSIT_REQUEST_ORDER)


class DepositRequestDetailView(ApiView):
    permission_classes = [CanViewDepositRequests]

    @extend_schema(
        operation_id="deposit_requests_retrieve",
        tags=["deposit requests"],
        summary="One deposit request (staff with ledger.view_depositrequest)",
        parameters=[WWW_AUTHENTICATE],
        responses={
            200: s.DepositRequestSerializer,
            **errors(*READ, 403, 404, e403="permission_denied: needs ledger.view_depositrequest."),
        },
    )
    def get(self, request, request_id: str):
        row = deposit_request_get(request_id=request_id)
        if row is None:
            raise DepositRequestNotFound()
        return Response(s.DepositRequestSerializer(row).data)


DECISION_ERRORS = {
    "e403": "permission_denied: needs ledger.approve_deposit; self_approval_forbidden: you requested this "
    "deposit, so another staff member must decide it; conflict_of_interest: an approval of a deposit into an "
    "account you own.",
    "e409": "deposit_request_not_pending: approve of a rejected request or reject of an approved one; "
    "`status` says which. deposit_rejected: the ledger refused the deposit (the account was closed meanwhile); "
    "the request stays pending.",
}


def decide(request, request_id: str, service) -> Response:
    """Parse the reason, call ``service`` (approve or reject), render the request as it is now."""
    body = s.DepositDecisionSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    decision = service(request_id=request_id, actor=request.user, reason=body.validated_data["reason"])
    return Response(s.DepositRequestSerializer(decision.request).data)


class DepositRequestApproveView(ApiView):
    permission_classes = [CanApproveDeposits]

    @extend_schema(
        operation_id="deposit_requests_approve",
        tags=["deposit requests"],
        summary="Approve another staff member's deposit request: the money moves (ledger.approve_deposit)",
        description=(
            "pending -> approved, a compare-and-set: the deposit posts once, under the ledger key `request_id` "
            "(returned as `deposit_id`), with a `deposit_approved` staff action naming you and `reason`, all in "
            "one transaction. Two approvers racing: one wins, the other gets 200 with the approved request and "
            "moves nothing; a repeat also answers 200 unchanged, so no Idempotency-Key is needed."
        ),
        request=s.DepositDecisionSerializer,
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.DepositRequestSerializer, **errors(*WRITE, 403, 404, 409, **DECISION_ERRORS)},
    )
    def post(self, request, request_id: str):
        return decide(request, request_id, deposit_request_approve)


class DepositRequestRejectView(ApiView):
    permission_classes = [CanApproveDeposits]

    @extend_schema(
        operation_id="deposit_requests_reject",
        tags=["deposit requests"],
        summary="Reject another staff member's deposit request: nothing moves (ledger.approve_deposit)",
        description=(
            "pending -> rejected, a compare-and-set, with a `deposit_rejected` staff action naming you and "
            "`reason`. A repeat answers 200 unchanged."
        ),
        request=s.DepositDecisionSerializer,
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.DepositRequestSerializer, **errors(*WRITE, 403, 404, 409, **DECISION_ERRORS)},
    )
    def post(self, request, request_id: str):
        return decide(request, request_id, deposit_request_reject)
