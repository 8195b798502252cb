"""Token authentication (django-rest-knox): expiring, revocable tokens, looked up only when
the key could be one."""

import re

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox import auth
from knox.settings import knox_settings
from knox.signals import token_expired
from rest_framework import exceptions


def _token_key_pattern() -> re.Pattern[bytes]:
    # What knox issues: TOKEN_PREFIX, then AUTH_TOKEN_CHARACTER_LENGTH lowercase hex digits.
    prefix = re.escape(knox_settings.TOKEN_PREFIX.encode())
    return re.compile(prefix + rb"[0-9a-f]{%d}" % knox_settings.AUTH_TOKEN_CHARACTER_LENGTH)


class TokenAuthentication(auth.TokenAuthentication):
    """knox's TokenAuthentication (``Authorization: Token <key>``) with two changes.

    * A key that is not of the form knox issues is refused before the database sees it (a
      NUL byte would otherwise reach PostgreSQL and fail there, and a non-UTF-8 byte
      would fail knox's decoding with a 500).
    * Only the presented token's own expiry is checked on each request. knox also loads
      every other token of the user to delete the expired ones, a query per request that
      grows with the user's logins; those are deleted when the user gets a new token
      (api/tokens.py) instead.

    An expired, revoked or unknown token is 401 ``not_authenticated``.
    """

    def authenticate_credentials(self, token: bytes):
        if not _token_key_pattern().fullmatch(token):
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)

    def _cleanup_token(self, auth_token) -> bool:
        """True (and the token deleted) when the presented token has expired."""
        if auth_token.expiry is None or auth_token.expiry >= timezone.now():
            return False
        username = auth_token.user.get_username()
        auth_token.delete()
        token_expired.send(sender=type(self), username=username, source="auth_token")
        return True


class TokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme: "tokenAuth", as before knox (drf-spectacular's knox
    extension matches knox's own class only, and under another name)."""

    target_class = TokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(
            header_name="Authorization", token_prefix=knox_settings.AUTH_HEADER_PREFIX
        )


class LoginLockedOut(exceptions.Throttled):
    """Too many failed logins for one username from one client address (django-axes): 429
    with Retry-After, until the cool-off has passed."""

    default_detail = "Too many failed logins for this username from your address."
    default_code = "login_locked_out"
