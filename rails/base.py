"""The rail interface: what a payout executor may ask a payment gateway, and what it answers.

A rail is called outside any database transaction. Its answers are values, never
exceptions (``settlement_report`` excepted: it raises ``RailUnavailable``):

* ``Paid`` - the gateway holds a payout for this key;
* ``Declined`` - definite: no payout exists for this key and none ever will;
* ``NotFound`` - (lookup only) the gateway has nothing under this key;
* ``Unknown`` - ambiguous: the payout may or may not exist; ask again with ``lookup``.
  ``sent`` is False only when the request provably never reached the gateway.
"""

import threading
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .http import HttpRail


@dataclass(frozen=True, slots=True)
class Paid:
    reference: str  # the gateway's payout id
    paid_at: datetime  # tz-aware, UTC
    amount: int
    destination: str


@dataclass(frozen=True, slots=True)
class Declined:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class NotFound:
    pass


@dataclass(frozen=True, slots=True)
class Unknown:
    error: str
    sent: bool


@dataclass(frozen=True, slots=True)
class SettlementRow:
    reference: str
    key: str
    amount: int
    destination: str
    paid_at: datetime


class RailUnavailable(Exception):
    """The rail could not answer (a settlement report that failed or made no sense)."""


SubmitOutcome = Paid | Declined | Unknown
LookupOutcome = Paid | Declined | NotFound | Unknown


class Rail(Protocol):
    name: str

    def submit(self, *, key: str, amount: int, destination: str, metadata: dict | None = None) -> SubmitOutcome:
        """Ask for a payout of ``amount`` to ``destination`` under the idempotency ``key``."""
        ...

    def lookup(self, *, key: str) -> LookupOutcome:
        """What the gateway holds under ``key``."""
        ...

    def settlement_report(self, *, day: date) -> list[SettlementRow]:
        """Every payout the gateway paid on ``day`` (UTC); raises ``RailUnavailable``."""
        ...


RAIL_NAMES = ("sandbox",)

_rails: dict[str, "HttpRail"] = {}
_rails_lock = threading.Lock()


def _build_rail(name: str) -> "HttpRail":
    from django.conf import settings

    from .http import HttpRail

    if name == "sandbox":
        return HttpRail(
            name="sandbox",
            base_url=settings.DELAYPAY_RAIL_SANDBOX_URL,
            api_key=settings.DELAYPAY_RAIL_SANDBOX_API_KEY,
            timeout=settings.DELAYPAY_RAIL_TIMEOUT_SECONDS,
            connections=settings.DELAYPAY_RAIL_CONNECTIONS,
            allow_hosts=settings.DELAYPAY_RAIL_ALLOW_HOSTS,
            allow_any_host=settings.DEBUG,
        )
    raise ValueError(f"unknown rail {name!r}: known rails are {', '.join(RAIL_NAMES)}")


def get_rail(name: str) -> Rail:
    """The process's one rail client called ``name`` (built from settings on first use)."""
    if name not in RAIL_NAMES:
        raise ValueError(f"unknown rail {name!r}: known rails are {', '.join(RAIL_NAMES)}")
    rail = _rails.get(name)
    if rail is None:
        with _rails_lock:
            rail = _rails.get(name)
            if rail is None:
                rail = _rails[name] = _build_rail(name)
    return rail


def close_rails() -> None:
    """Close every cached rail's connections and forget them (the next ``get_rail`` builds
    a new one from the settings of that moment)."""
    with _rails_lock:
        rails = list(_rails.values())
        _rails.clear()
    for rail in rails:
        rail.close()
