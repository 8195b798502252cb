"""The process's rail clients, one per rail, built from settings on first use: ``get_rail``
and ``close_rails``. Apart from rails/base.py (the interface and its answers) so that the
interface does not import its implementation (rails/http.py imports the interface)."""

import threading

from .base import RAIL_NAMES, RailClient
from .http import HttpRail

_rails: dict[str, HttpRail] = {}
_rails_lock = threading.Lock()


def _build_rail(name: str) -> HttpRail:
    from django.conf import settings

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


def get_rail(name: str) -> RailClient:
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
