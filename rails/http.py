"""``HttpRail``: a rail spoken to over HTTP (docs/reference/rail-contract.md).

One ``httpx.Client`` per rail, safe to share between threads: pooled keep-alive
connections, and a transport that retries only failed connection attempts (nothing has
been sent then, so a retry cannot pay twice). Nothing else is retried here: what to do
about an ambiguous answer is the payout executor's decision, made with ``lookup``.

Neither the API key nor a destination is ever logged or put in an error text.

Where a rail may connect (SSRF, rails/addresses.py): its URL's host must normalise, and
unless it is in ``allow_hosts`` (DELAYPAY_RAIL_ALLOW_HOSTS; the sandbox gateway runs on
loopback) or ``allow_any_host`` (DEBUG), the URL must be ``https://`` and every address
its host resolves to, at every new connection, must be outside the IANA special-purpose
registries; the socket connects to the address that was checked. A refused rail opens no
socket: each call answers ``Unknown(sent=False)`` with the reason, as if the gateway were
unreachable, and the settlement report raises ``SettlementReportUnavailable``.
"""

import csv
import io
import logging
from collections.abc import Callable, Collection
from datetime import UTC, date, datetime

import httpcore
import httpx

from . import addresses
from .base import (
    Declined,
    LookupOutcome,
    NotFound,
    Paid,
    SettlementReportUnavailable,
    SettlementRow,
    SubmitOutcome,
    Unknown,
)

logger = logging.getLogger(__name__)

USER_AGENT = "delaypay-rails/1"
CONNECT_RETRIES = 2
CONNECT_TIMEOUT_CAP = 2.0
SETTLEMENT_COLUMNS = ("id", "idempotency_key", "amount", "currency", "destination", "status", "created")
# The hosts a rail may reach over plain http and on any address when nothing else is said:
# the sandbox gateway's (the Procfile's ``gateway`` listens on 127.0.0.1). Settings'
# DELAYPAY_RAIL_ALLOW_HOSTS has the same default.
DEFAULT_ALLOW_HOSTS = ("127.0.0.1", "localhost")


class MalformedAnswer(ValueError):
    """A 2xx answer that does not hold what the contract says it holds."""


def _error_text(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


def _parse_created(value: object) -> datetime:
    if not isinstance(value, str):
        raise MalformedAnswer("created is not a string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise MalformedAnswer("created is not an ISO 8601 time") from exc
    if moment.tzinfo is None:
        raise MalformedAnswer("created has no time zone")
    return moment.astimezone(UTC)


def _paid(payout: object) -> Paid:
    """A ``Paid`` from a payout object whose status is paid."""
    if not isinstance(payout, dict):
        raise MalformedAnswer("the payout is not an object")
    reference, amount, destination = payout.get("id"), payout.get("amount"), payout.get("destination")
    if not isinstance(reference, str) or not reference:
        raise MalformedAnswer("the payout has no id")
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise MalformedAnswer("the payout's amount is not an integer")
    if not isinstance(destination, str):
        raise MalformedAnswer("the payout's destination is not a string")
    return Paid(
        reference=reference, paid_at=_parse_created(payout.get("created")), amount=amount, destination=destination
    )


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError as exc:
        raise MalformedAnswer("the answer is not JSON") from exc
    if not isinstance(body, dict):
        raise MalformedAnswer("the answer is not a JSON object")
    return body


def _error_code(response: httpx.Response) -> str:
    """The contract's ``error.code`` of an answer, or '' when it has none."""
    try:
        error = _json(response).get("error")
    except MalformedAnswer:
        return ""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else ""


def _declined(response: httpx.Response, *, default_code: str) -> Declined:
    try:
        error = _json(response).get("error")
    except MalformedAnswer:
        error = None
    error = error if isinstance(error, dict) else {}
    code = error.get("decline_code") or error.get("code") or default_code
    message = error.get("message") or f"HTTP {response.status_code}"
    return Declined(code=str(code)[:100], message=str(message)[:500])


def url_refusal(url: str, *, allowed: Callable[[addresses.Host], bool]) -> str | None:
    """Why a rail may not use ``url`` (checked before any resolution), or None;
    ``allowed(host)`` says whether a normalised host is exempt."""
    try:
        parts, host, _ = addresses.split_url(url)
        httpx.URL(url)
    except (addresses.Refused, httpx.InvalidURL) as exc:
        return str(exc)
    if allowed(host):
        return None
    if parts.scheme != "https":
        return "only https:// URLs are allowed (the API key would travel in the clear)"
    return addresses.host_refusal(host)


class CheckedBackend(httpcore.SyncBackend):
    """httpcore's network backend that resolves the host itself, refuses (a
    ``ConnectError``, nothing sent) when any address is refused, and connects the socket
    to a checked address; the TLS server name stays the URL's host."""

    def __init__(self, allowed: Callable[[addresses.Host], bool]):
        self._allowed = allowed

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            checked = addresses.normalise_host(f"[{host}]" if ":" in host else host)
            found = addresses.resolve(checked, port, allowed=self._allowed)
        except addresses.Refused as exc:
            raise httpcore.ConnectError(f"refused: {exc}") from None
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        error: Exception | None = None
        for address in found:  # as socket.create_connection: the next one when one fails
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error


class HttpRail:
    """A gateway at ``base_url`` that speaks the contract in docs/reference/rail-contract.md."""

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        api_key: str = "",
        timeout: float = 5.0,
        connections: int = 64,
        allow_hosts: Collection[str] = DEFAULT_ALLOW_HOSTS,
        allow_any_host: bool = False,
    ):
        self.name = name
        allow = addresses.allow_list(allow_hosts)

        def allowed(host: addresses.Host) -> bool:
            return allow_any_host or host.name in allow

        self._client: httpx.Client | None = None
        self.refusal = url_refusal(base_url, allowed=allowed)
        if self.refusal:
            logger.error("rail %s: its URL is refused, no call will be sent: %s", name, self.refusal)
            return
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        transport = httpx.HTTPTransport(
            retries=CONNECT_RETRIES,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )
        # httpx has no public way to hand its pool a network backend: set the pool's, and
        # fail here rather than connect unchecked should a new httpx or httpcore move it.
        pool = getattr(transport, "_pool", None)
        if not isinstance(getattr(pool, "_network_backend", None), httpcore.SyncBackend):
            raise RuntimeError("httpx's connection pool changed: the rail's address check cannot be installed")
        pool._network_backend = CheckedBackend(allowed)
        self._client = httpx.Client(
            base_url=base_url,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_CAP)),
            headers=headers,
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment between us and the gateway
        )

    def __repr__(self) -> str:  # never the headers: they hold the API key
        return f"<HttpRail {self.name} {self._client.base_url if self._client else 'refused'}>"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> "HttpRail":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unknown(self, what: str, key: str, error: str, *, sent: bool) -> Unknown:
        logger.warning("rail %s: %s of %s is unknown (sent=%s): %s", self.name, what, key, sent, error)
        return Unknown(error=error, sent=sent)

    def _request(self, what: str, key: str, method: str, url: str, **kwargs) -> httpx.Response | Unknown:
        """The answer, or ``Unknown`` for a request that failed on the way."""
        if self._client is None:
            return self._unknown(what, key, f"refused: {self.refusal}", sent=False)
        try:
            return self._client.request(method, url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Every connection attempt failed (after the transport's retries), or no pooled
            # connection came free: not one byte of the request went out.
            return self._unknown(what, key, _error_text(exc), sent=False)
        except httpx.HTTPError as exc:
            # A read/write timeout, a dropped connection, a broken answer: it may have arrived.
            return self._unknown(what, key, _error_text(exc), sent=True)

    def submit(self, *, key: str, amount: int, destination: str, metadata: dict | None = None) -> SubmitOutcome:
        """Ask for a payout under the idempotency ``key``; never raises for network or HTTP problems."""
        body: dict = {"amount": amount, "currency": "RBX", "destination": destination}
        if metadata:
            body["metadata"] = metadata
        response = self._request("submit", key, "POST", "/v1/payouts", json=body, headers={"Idempotency-Key": key})
        if isinstance(response, Unknown):
            return response
        status = response.status_code
        if status in (200, 201):
            try:
                payout = _json(response)
                if payout.get("status") != "paid":
                    raise MalformedAnswer(f"a {status} answer whose status is not paid")
                paid = _paid(payout)
                if paid.amount != amount or paid.destination != destination:
                    raise MalformedAnswer("the payout's amount or destination is not the one asked for")
            except MalformedAnswer as exc:
                return self._unknown("submit", key, f"HTTP {status}: {exc}", sent=True)
            return paid
        if status == 402:
            return _declined(response, default_code="payout_declined")
        if status == 400:
            return _declined(response, default_code="invalid_request")
        # 401/403 (our configuration), 404, 409 (key reused), 429, 5xx, anything else: ambiguous.
        code = _error_code(response)
        return self._unknown("submit", key, f"HTTP {status}" + (f" {code}" if code else ""), sent=True)

    def lookup(self, *, key: str) -> LookupOutcome:
        """What the gateway holds under ``key``; never raises for network or HTTP problems."""
        response = self._request("lookup", key, "GET", "/v1/payouts", params={"idempotency_key": key})
        if isinstance(response, Unknown):
            return response
        if response.status_code != 200:
            code = _error_code(response)
            return self._unknown(
                "lookup", key, f"HTTP {response.status_code}" + (f" {code}" if code else ""), sent=True
            )
        try:
            data = _json(response).get("data")
            if not isinstance(data, list) or not all(isinstance(payout, dict) for payout in data):
                raise MalformedAnswer("the list has no data")
            paid = [payout for payout in data if payout.get("status") == "paid"]
            if paid:
                if len(paid) > 1:
                    logger.error("rail %s: %d payouts under one key %s", self.name, len(paid), key)
                return _paid(paid[0])
            if not data:
                return NotFound()
            declined = data[0]
            if declined.get("status") != "declined":
                raise MalformedAnswer("a payout whose status is neither paid nor declined")
            code = declined.get("decline_code") or "payout_declined"
            return Declined(code=str(code)[:100], message="declined (lookup)")
        except MalformedAnswer as exc:
            return self._unknown("lookup", key, f"HTTP 200: {exc}", sent=True)

    def settlement_report(self, *, day: date) -> list[SettlementRow]:
        """Every payout the gateway paid on ``day`` (UTC). Raises ``SettlementReportUnavailable`` on any failure."""
        if self._client is None:
            raise SettlementReportUnavailable(f"settlement report of {day}: refused: {self.refusal}")
        try:
            response = self._client.get(f"/v1/settlements/{day.isoformat()}")
        except httpx.HTTPError as exc:
            raise SettlementReportUnavailable(f"settlement report of {day}: {_error_text(exc)}") from exc
        if response.status_code != 200:
            raise SettlementReportUnavailable(f"settlement report of {day}: HTTP {response.status_code}")
        try:
            reader = csv.DictReader(io.StringIO(response.text, newline=""))
            missing = set(SETTLEMENT_COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise MalformedAnswer(f"columns missing: {', '.join(sorted(missing))}")
            rows = []
            for line in reader:
                if None in line or any(value is None for value in line.values()):
                    raise MalformedAnswer("a row with too many or too few fields")
                if line["status"] != "paid":
                    raise MalformedAnswer("a row whose status is not paid")
                rows.append(
                    SettlementRow(
                        reference=line["id"],
                        key=line["idempotency_key"],
                        amount=int(line["amount"]),
                        destination=line["destination"],
                        paid_at=_parse_created(line["created"]),
                    )
                )
        except (csv.Error, ValueError) as exc:  # MalformedAnswer is a ValueError
            raise SettlementReportUnavailable(f"settlement report of {day}: {_error_text(exc)}") from exc
        return rows
