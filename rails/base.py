"""The rail interface: what a payout executor may ask a payment gateway, and what it answers.

A rail is called outside any database transaction. Its answers are values, never
exceptions (``settlement_report`` excepted: it raises ``SettlementReportUnavailable``):

* ``Paid`` - the gateway holds a payout for this key;
* ``Declined`` - definite: no payout exists for this key and none ever will;
* ``NotFound`` - (lookup only) the gateway has nothing under this key;
* ``Unknown`` - ambiguous: the payout may or may not exist; ask again with ``lookup``.
  ``sent`` is False only when the request provably never reached the gateway.
"""

from dataclasses import dataclass
from datetime import date, datetime
from typing import Protocol


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


class SettlementReportUnavailable(Exception):
    """The rail could not answer (a settlement report that failed or made no sense)."""


SubmitOutcome = Paid | Declined | Unknown
LookupOutcome = Paid | Declined | NotFound | Unknown


class RailClient(Protocol):
    name: str

    def submit(self, *, key: str, amount: int, destination: str, metadata: dict | None = None) -> SubmitOutcome:
        """Ask for a payout of ``amount`` to ``destination`` under the idempotency ``key``."""
        ...

    def lookup(self, *, key: str) -> LookupOutcome:
        """What the gateway holds under ``key``."""
        ...

    def settlement_report(self, *, day: date) -> list[SettlementRow]:
        """Every payout the gateway paid on ``day`` (UTC); raises ``SettlementReportUnavailable``."""
        ...


RAIL_NAMES = ("sandbox",)
