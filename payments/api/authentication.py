"""Token authentication that looks a token up only when it could be one."""

import re

from rest_framework import authentication, exceptions

_TOKEN_KEY = re.compile(r"[0-9a-f]{40}")


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's TokenAuthentication, refusing malformed keys before the database sees them
    (a NUL byte in a key would otherwise reach PostgreSQL and fail there)."""

    def authenticate_credentials(self, key):
        if not _TOKEN_KEY.fullmatch(key):
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(key)
