"""Where webhooks may be sent (SSRF): checked when an endpoint is saved and again at every
delivery, after DNS resolution, on the very address the request then connects to.

The host is read as a resolver reads it and the addresses are checked against the IANA
special-purpose registries written out in rails/addresses.py (not ``ipaddress``'s tables,
whose answers change between Python versions):

* Only ``https://`` URLs, unless DEBUG or the host is listed in
  DELAYPAY_WEBHOOK_ALLOW_HOSTS (tests and local receivers: ``127.0.0.1,localhost``).
  A listed host is compared in canonical form: ``LOCALHOST`` is ``localhost``, while
  ``0x7f000001`` is not ``127.0.0.1`` (it is refused before the list is read).
* Never, whatever DEBUG or the list say: whitespace or control characters, credentials,
  a fragment, a percent-encoded host, a host that is not a name, a dotted-quad IPv4
  address or a bracketed IPv6 address, and every other spelling a resolver reads as an
  IPv4 address (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``, ``①②⑦.0.0.1``).
* No address in a registry entry (loopback, private-use, link-local, shared, multicast,
  documentation, 6to4, NAT64, Teredo, unique or site-local, ...), no IPv4-mapped IPv6
  address of one, no loopback name (``localhost``, ``*.localhost``); for the same exceptions.
* At save time a literal address is checked (a name may resolve differently by delivery
  time, so resolving it then proves little and would make the API wait on DNS); at
  delivery time every address the name resolves to is checked, and the connection goes to
  the checked one (``resolve_target``), so a DNS answer that changes between the check and
  the connection (rebinding) cannot redirect it.
"""

from dataclasses import dataclass

import httpx
from django.conf import settings

from payments.exceptions import PaymentValidationError
from rails import addresses
from rails.addresses import Host

MAX_URL_LENGTH = 2000


class WebhookURLRefused(PaymentValidationError):
    """An endpoint URL the SSRF rules refuse: a 400 ``validation_error`` on ``url``."""

    def __init__(self, reason: str):
        super().__init__({"url": [reason]}, detail=f"This webhook URL is not allowed: {reason}")
        self.reason = reason


class DeliveryRefused(Exception):
    """The address check refused a delivery (no socket was opened)."""


@dataclass(frozen=True)
class Target:
    """Where a delivery connects: the checked ``address``, the URL's ``host`` in canonical
    form (Host header and TLS server name) and ``port``."""

    host: str
    address: str
    port: int


def address_refusal(address: str) -> str | None:
    """Why ``address`` may not receive webhooks (the registry entry it falls in), or None
    when it may."""
    return addresses.address_refusal(address)


def _allowed(host: Host) -> bool:
    return settings.DEBUG or host.name in addresses.allow_list(settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS)


def _split(url: str):
    if len(url) > MAX_URL_LENGTH:
        raise WebhookURLRefused(f"at most {MAX_URL_LENGTH} characters")
    try:
        parts, host, port = addresses.split_url(url)
    except addresses.Refused as exc:
        raise WebhookURLRefused(str(exc)) from None
    if parts.fragment:
        raise WebhookURLRefused("a fragment (#...) is not sent to a server")
    try:
        httpx.URL(url)  # the client that sends deliveries must read it too
    except httpx.InvalidURL as exc:
        raise WebhookURLRefused(f"not a URL the HTTP client accepts ({exc})") from None
    return parts, host, port


def validate_endpoint_url(url: str) -> None:
    """Refuse (``WebhookURLRefused``) a URL webhooks may not be sent to, at save time."""
    parts, host, _ = _split(url)
    if _allowed(host):
        return
    if parts.scheme != "https":
        raise WebhookURLRefused("only https:// URLs are allowed")
    reason = addresses.host_refusal(host)  # a name's addresses are checked at delivery time
    if reason:
        raise WebhookURLRefused(reason)


def resolve_target(url: str) -> Target:
    """The address a delivery to ``url`` connects to, checked now; ``DeliveryRefused``
    (before any socket is opened) when the URL or any address its host resolves to is
    not allowed."""
    try:
        parts, host, port = _split(url)
    except WebhookURLRefused as exc:
        raise DeliveryRefused(exc.reason) from None
    if parts.scheme != "https" and not _allowed(host):
        raise DeliveryRefused("only https:// URLs are allowed")
    try:
        # Every address, not only the first: a name that also resolves to a private
        # address is refused whichever one a resolver would have picked.
        found = addresses.resolve(host, port, allowed=_allowed)
    except addresses.Refused as exc:
        raise DeliveryRefused(str(exc)) from None
    except (OSError, UnicodeError) as exc:
        raise DeliveryRefused(f"cannot resolve {host.name}: {exc}") from None
    # IPv4 first: a receiver listening on 127.0.0.1 is reachable as "localhost" too.
    address = sorted(found, key=lambda a: ":" in a)[0]
    return Target(host=host.name, address=address, port=port)
