"""Payees: the people outside the ledger a user pays through a rail (payouts)."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response

from api import serializers as s
from api.base import ApiView, render
from api.idempotency import run_idempotent
from api.pagination import paginated_response
from api.schema import IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, READ, RETRY_AFTER, WRITE, WWW_AUTHENTICATE, errors, page_of
from api.throttling import CreateThrottle
from payouts.payees import payee_create, payee_delete, payee_get, payee_visible_to

PAYEE_ORDER = ("-created_at", "-id")


class PayeeListCreateView(ApiView):
    throttle_classes = [CreateThrottle]
    throttle_scope = "create"

    @extend_schema(
        operation_id="payees_list",
        tags=["payees"],
        summary="Your payees, newest first (staff with payments.view_payee: every payee)",
        parameters=[s.PageQuerySerializer, WWW_AUTHENTICATE],
        responses={200: page_of(s.PayeeSerializer, "PayeePage"), **errors(400, *READ)},
    )
    def get(self, request):
        s.PageQuerySerializer.parse(request)
        return paginated_response(request, payee_visible_to(user=request.user), s.PayeeSerializer,
                                  ordering=PAYEE_ORDER)

    @extend_schema(
        operation_id="payees_create",
        tags=["payees"],
        summary="Add a payee: someone outside the ledger, paid through a rail",
        description=(
            "Then schedule payouts to it: `POST /payments` with `to_payee` instead of `to_account`. Only you "
            "see and pay your payees (404 for anyone else)."
        ),
        request=s.PayeeCreateSerializer,
        parameters=[IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER, WWW_AUTHENTICATE],
        responses={
            201: OpenApiResponse(s.PayeeSerializer, description="Created (or a replay of the first response)."),
            **errors(*WRITE, 409, 429, e409="idempotency_key_reused or idempotency_key_in_use."),
        },
    )
    def post(self, request):
        def create():
            body = s.PayeeCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            payee = payee_create(owner=request.user, **body.validated_data)
            payee.refresh_from_db()
            return 201, render(s.PayeeSerializer(payee).data)

        return run_idempotent(request, create)


class PayeeDetailView(ApiView):
    @extend_schema(
        operation_id="payees_retrieve",
        tags=["payees"],
        summary="One of your payees",
        parameters=[WWW_AUTHENTICATE],
        responses={200: s.PayeeSerializer, **errors(*READ, 404)},
    )
    def get(self, request, payee_id: str):
        return Response(s.PayeeSerializer(payee_get(user=request.user, payee_id=payee_id)).data)

    @extend_schema(
        operation_id="payees_delete",
        tags=["payees"],
        summary="Delete one of your payees",
        description=(
            "204. The payouts already made to it keep pointing at it. 409 payee_in_use while payouts to it "
            "are SCHEDULED, EXECUTING or NEEDS_REVIEW, or a recurring payment to it is active or paused. Only its "
            "owner deletes a payee: 403 for staff who may read it, 404 for anyone else."
        ),
        parameters=[WWW_AUTHENTICATE],
        responses={204: None, **errors(*WRITE, 403, 404, 409, e409="payee_in_use: `pending` says how many.",
                                       e403="permission_denied: you may read this payee, only its owner deletes it.")},
    )
    def delete(self, request, payee_id: str):
        payee_delete(user=request.user, payee_id=payee_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
