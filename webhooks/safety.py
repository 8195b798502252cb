"""Where webhooks may be sent (SSRF): checked when an endpoint is saved and again at every
delivery, after DNS resolution, on the very address the request then connects to.

* Only ``https://`` URLs, unless DEBUG or the host is listed in
  DELAYPAY_WEBHOOK_ALLOW_HOSTS (tests and local receivers: ``127.0.0.1,localhost``).
* No private, loopback, link-local, multicast, reserved or unspecified address (nor an
  IPv4 address mapped into IPv6 that is one), for the same exceptions.
* At save time a literal address is checked (a name may resolve differently by delivery
  time, so resolving it then proves little and would make the API wait on DNS); at
  delivery time every address the name resolves to is checked, and the connection goes to
  the checked one (``resolve_target``), so a DNS answer that changes between the check and
  the connection (rebinding) cannot redirect it.
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from payments.exceptions import PaymentValidationError

# Names that are loopback whatever DNS says.
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class WebhookURLRefused(PaymentValidationError):
    """An endpoint URL the SSRF rules refuse: a 400 ``validation_error`` on ``url``."""

    def __init__(self, reason: str):
        super().__init__({"url": [reason]}, detail=f"This webhook URL is not allowed: {reason}")
        self.reason = reason


class DeliveryRefused(Exception):
    """The address check refused a delivery (no socket was opened)."""


@dataclass(frozen=True)
class Target:
    """Where a delivery connects: the checked ``address``, the URL's ``host`` (Host header
    and TLS server name) and ``port``."""

    host: str
    address: str
    port: int


def _allowed_host(host: str) -> bool:
    return settings.DEBUG or host.lower() in settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS


def address_refusal(address: str) -> str | None:
    """Why ``address`` may not receive webhooks, or None when it may."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for attribute in ("is_unspecified", "is_loopback", "is_link_local", "is_multicast", "is_reserved", "is_private"):
        if getattr(ip, attribute):
            return f"{ip} is a {attribute.removeprefix('is_').replace('_', '-')} address"
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return f"{ip} is not a public address"
    return None


def _split(url: str):
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookURLRefused(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookURLRefused("the URL must be https://host/...")
    if parts.username is not None or parts.password is not None:
        raise WebhookURLRefused("credentials in the URL are not allowed; the signature authenticates us")
    if parts.fragment:
        raise WebhookURLRefused("a fragment (#...) is not sent to a server")
    return parts, port or (443 if parts.scheme == "https" else 80)


def validate_endpoint_url(url: str) -> None:
    """Refuse (``WebhookURLRefused``) a URL webhooks may not be sent to, at save time."""
    if len(url) > 2000:
        raise WebhookURLRefused("at most 2000 characters")
    parts, _ = _split(url)
    host = parts.hostname
    if _allowed_host(host):
        return
    if parts.scheme != "https":
        raise WebhookURLRefused("only https:// URLs are allowed")
    if host.lower().rstrip(".") in _LOCAL_NAMES or host.lower().endswith(".localhost"):
        raise WebhookURLRefused(f"{host} is a loopback name")
    try:
        reason = address_refusal(host)
    except ValueError:  # a name, not a literal address: checked at delivery time
        return
    if reason:
        raise WebhookURLRefused(reason)


def resolve_target(url: str) -> Target:
    """The address a delivery to ``url`` connects to, checked now; ``DeliveryRefused``
    (before any socket is opened) when the URL or any address its host resolves to is
    not allowed."""
    try:
        parts, port = _split(url)
    except WebhookURLRefused as exc:
        raise DeliveryRefused(exc.reason) from None
    host = parts.hostname
    allowed = _allowed_host(host)
    if parts.scheme != "https" and not allowed:
        raise DeliveryRefused("only https:// URLs are allowed")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise DeliveryRefused(f"cannot resolve {host}: {exc}") from None
    # IPv4 first: a receiver listening on 127.0.0.1 is reachable as "localhost" too.
    addresses = sorted(dict.fromkeys(info[4][0] for info in infos), key=lambda a: ":" in a)
    if not addresses:
        raise DeliveryRefused(f"{host} resolves to no address")
    if not allowed:
        # Every address, not only the first: a name that also resolves to a private
        # address is refused whichever one a resolver would have picked.
        for address in addresses:
            reason = address_refusal(address)
            if reason:
                raise DeliveryRefused(f"{host} resolves to {reason}")
    return Target(host=host, address=addresses[0], port=port)
