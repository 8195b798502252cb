"""What the API's resource modules (accounts, payments, recurring, auth) share.

Their views parse, call one service or selector, render. Business rules live in the
services; who may see what lives in the selectors; the OpenAPI description of each
operation sits on its method; api/errors.py turns exceptions into HTTP."""

from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from common.authz import staff_may

# Newest first everywhere; the last field makes every ordering unique (cursor-stable).
PAYMENT_ORDER = ("-execute_at", "-id")
ACCOUNT_ORDER = ("-created_at", "-id")
TRANSFER_ORDER = ("-id",)
RECURRING_ORDER = ("-created_at", "-id")
OCCURRENCE_ORDER = ("-occurrence_at", "-id")


def render(data) -> str:
    return JSONRenderer().render(data).decode()


class ApiView(APIView):
    """No OPTIONS self-description (the OpenAPI schema is the description): OPTIONS is
    405 and absent from Allow."""

    http_method_names = ["get", "post", "patch", "delete", "head"]


def needs_permission(perm: str, message: str) -> type[BasePermission]:
    """A view permission: the same model permission the admin asks for the act
    (common/authz.py, ``staff_may``); ``message`` is the 403's detail."""

    class ModelPermission(BasePermission):
        def has_permission(self, request, view):
            return staff_may(request.user, perm)

    ModelPermission.message = message
    ModelPermission.__name__ = ModelPermission.__qualname__ = f"Needs({perm})"
    return ModelPermission
