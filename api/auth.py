"""/auth: a username and password for an expiring API token; logging a token, or all of
the user's tokens, out (api/tokens.py)."""

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.signals import user_logged_in
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from api import serializers as s
from api.authentication import LoginLockedOut
from api.base import ApiView
from api.schema import READ, RETRY_AFTER, WWW_AUTHENTICATE, errors
from api.throttling import ScopedThrottle
from api.tokens import api_token_issue, api_token_revoke, api_tokens_revoke_all
from payments.exceptions import InvalidCredentials


class TokenView(ApiView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"

    @extend_schema(
        operation_id="auth_token_create",
        tags=["auth"],
        summary="Exchange a username and password for an API token",
        description=(
            "Every call issues a new token, valid until `expires_at` (DELAYPAY_TOKEN_TTL_HOURS after issue); "
            "send it as `Authorization: Token <token>`. Changing the password revokes all of the user's tokens. "
            "Failed logins are counted per username and client address, together with the admin's login: "
            "after DELAYPAY_LOGIN_FAILURE_LIMIT of them that pair is locked out (429 login_locked_out, even "
            "with the right password) until DELAYPAY_LOGIN_COOLOFF_MINUTES have passed without another try."
        ),
        request=s.TokenRequestSerializer,
        responses={
            200: s.TokenResponseSerializer,
            **errors(
                400, 406, 413, 415, 429,
                e429="throttled: too many requests from this address; or login_locked_out: too many failed "
                "logins for this username from this address. Retry after `retry_after` seconds (also the "
                "Retry-After header).",
            ),
        },
        parameters=[RETRY_AFTER],
        auth=[],
    )
    def post(self, request):
        body = s.TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        # django-axes counts the failure, or refuses a locked-out pair, inside authenticate().
        user = authenticate(request, **body.validated_data)
        if getattr(request, "axes_locked_out", False):
            raise LoginLockedOut(wait=settings.AXES_COOLOFF_TIME.total_seconds())
        if user is None or not user.is_active:
            raise InvalidCredentials()
        token, key = api_token_issue(user=user)
        # A login: last_login is updated, and django-axes forgets the pair's earlier failures.
        user_logged_in.send(sender=type(user), request=request, user=user)
        return Response(s.TokenResponseSerializer({"token": key, "expires_at": token.expiry}).data)


class LogoutView(ApiView):
    @extend_schema(
        operation_id="auth_logout",
        tags=["auth"],
        summary="Revoke the token this request is authenticated with",
        description="The token is deleted: any further request with it is 401 not_authenticated.",
        request=None,
        parameters=[WWW_AUTHENTICATE],
        responses={204: OpenApiResponse(description="Revoked."), **errors(*READ)},
    )
    def post(self, request):
        api_token_revoke(token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)


class LogoutAllView(ApiView):
    @extend_schema(
        operation_id="auth_logout_all",
        tags=["auth"],
        summary="Revoke every token of the authenticated user, this one included",
        description="For a token that may have leaked: every token the user holds is deleted.",
        request=None,
        parameters=[WWW_AUTHENTICATE],
        responses={204: OpenApiResponse(description="All revoked."), **errors(*READ)},
    )
    def post(self, request):
        api_tokens_revoke_all(user_id=request.user.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)
