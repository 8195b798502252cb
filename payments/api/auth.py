"""POST /auth/token: a username and password for an API token."""

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from payments.exceptions import InvalidCredentials

from . import serializers as s
from .base import ApiView
from .schema import RETRY_AFTER, errors
from .throttling import ScopedThrottle


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
