"""The client's address, one rule for every per-client limit: the API's throttles and the
login lockout (django-axes, AXES_CLIENT_IP_CALLABLE in delaypay/settings.py)."""

import ipaddress

from rest_framework.throttling import BaseThrottle


def client_address(request) -> str | None:
    """REST framework's rule, the one its throttles use: ``REMOTE_ADDR``, or with
    ``DELAYPAY_NUM_PROXIES`` trusted proxies in front the ``X-Forwarded-For`` entry the
    outermost of them appended. None when that is not an IP address (a header a proxy
    passed on unchecked): django-axes stores the address in an ``inet`` column."""
    address = BaseThrottle().get_ident(request)
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None
