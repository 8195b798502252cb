"""Where a rail may connect (SSRF, rails/addresses.py): its URL is checked when the rail is
built, and every address its host resolves to at every new connection. A refused rail
opens no socket and answers ``Unknown(sent=False)``, as an unreachable gateway does. No
test aims a request at anything but loopback."""

import socket
from datetime import date

import httpcore
import pytest

from rails import http
from rails.base import Paid, SettlementReportUnavailable, Unknown
from rails.http import HttpRail
from rails.registry import close_rails, get_rail


def fake_dns(monkeypatch, *addresses):
    def getaddrinfo(host, port, *args, **kwargs):
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("https://169.254.169.254/", "169.254.0.0/16"),  # cloud metadata
        ("https://0xa9fea9fe/", "non-canonical"),
        ("https://2130706433:8090/", "non-canonical"),
        ("https://127.1:8090/", "non-canonical"),
        ("https://10.1.2.3:8090/", "10.0.0.0/8"),
        ("https://[::ffff:10.1.2.3]/", "10.0.0.0/8"),
        ("https://[2002:a9fe:a9fe::]/", "2002::/16"),
        ("https://[fec0::1]/", "fec0::/10"),
        ("https://gw.localhost/", "loopback name"),
        ("http://gateway.example:8090/", "only https"),  # the API key would travel in the clear
        ("https://user:pw@gateway.example/", "credentials"),
        ("https://gate way.example/", "whitespace"),
        ("ftp://gateway.example/", "https://host"),
    ],
)
def test_a_refused_rail_url_opens_no_socket_and_answers_unknown_unsent(no_sockets, monkeypatch, caplog, url, named):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("a refused host was resolved"))
    with HttpRail(name="sandbox", base_url=url) as rail:
        assert named in rail.refusal
        assert rail.submit(key="k1", amount=100, destination="acct_1") == Unknown(
            error=f"refused: {rail.refusal}", sent=False
        )
        assert rail.lookup(key="k1") == Unknown(error=f"refused: {rail.refusal}", sent=False)
        with pytest.raises(SettlementReportUnavailable, match="refused"):
            rail.settlement_report(day=date(2026, 1, 2))
        assert "refused" in repr(rail)
    assert "its URL is refused" in caplog.text


def test_get_rail_applies_debug_and_the_rail_allow_list(settings, no_sockets):
    """Nothing is called here (nothing listens at 10.1.2.3): only whether the rail was refused."""
    settings.DEBUG = False
    settings.DELAYPAY_RAIL_SANDBOX_URL = "http://10.1.2.3:8090"
    settings.DELAYPAY_RAIL_ALLOW_HOSTS = ["127.0.0.1", "localhost"]
    close_rails()
    assert "only https" in get_rail("sandbox").refusal  # plain http is refused first
    settings.DELAYPAY_RAIL_SANDBOX_URL = "https://10.1.2.3:8090"
    close_rails()
    assert "10.0.0.0/8: private-use" in get_rail("sandbox").refusal
    settings.DELAYPAY_RAIL_ALLOW_HOSTS = ["10.1.2.3"]
    close_rails()
    assert get_rail("sandbox").refusal is None
    settings.DELAYPAY_RAIL_ALLOW_HOSTS = []
    settings.DEBUG = True
    close_rails()
    assert get_rail("sandbox").refusal is None
    settings.DELAYPAY_RAIL_SANDBOX_URL = "http://0x7f000001:8090"  # a numeric spelling: refused even in DEBUG
    close_rails()
    assert "non-canonical" in get_rail("sandbox").refusal
    close_rails()


def test_the_sandbox_gateway_on_loopback_is_allowed_by_default(settings):
    assert settings.DELAYPAY_RAIL_ALLOW_HOSTS == list(http.DEFAULT_ALLOW_HOSTS) == ["127.0.0.1", "localhost"]
    assert HttpRail(name="sandbox", base_url="http://127.0.0.1:8090").refusal is None
    assert HttpRail(name="sandbox", base_url="http://LOCALHOST.:8090").refusal is None
    assert "non-canonical" in HttpRail(name="sandbox", base_url="http://127.0.0.1.:8090").refusal


@pytest.mark.parametrize("address", ["10.0.0.7", "169.254.169.254", "::1", "fd00::7", "2002:a00:7::"])
def test_a_name_resolving_to_a_refused_address_is_refused_when_connecting(no_sockets, monkeypatch, address):
    fake_dns(monkeypatch, "93.184.215.14", address)
    with HttpRail(name="sandbox", base_url="https://gateway.example", timeout=1) as rail:
        assert rail.refusal is None  # a name: its addresses are checked when connecting
        outcome = rail.submit(key="k1", amount=100, destination="acct_1")
    assert isinstance(outcome, Unknown) and outcome.sent is False
    assert outcome.error.startswith(f"ConnectError: refused: gateway.example resolves to {address} is ")


def test_the_socket_connects_to_the_address_that_was_checked(monkeypatch):
    """The TCP connection goes to the checked address, not to a second lookup's answer
    (the TLS server name stays the URL's host: httpcore passes it to start_tls)."""
    fake_dns(monkeypatch, "93.184.215.14")
    seen = []

    def connect_tcp(self, host, port, *args, **kwargs):
        seen.append((host, port))
        raise httpcore.ConnectError("stopped before any socket")

    monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", connect_tcp)
    with HttpRail(name="sandbox", base_url="https://gateway.example:8443", timeout=1) as rail:
        outcome = rail.lookup(key="k1")
    assert isinstance(outcome, Unknown) and outcome.sent is False
    assert seen and set(seen) == {("93.184.215.14", 8443)}


def test_an_allow_listed_name_connects_through_the_checked_backend(gateway, key):
    """localhost (listed by default) resolves to ::1 and 127.0.0.1: the backend tries each
    in turn, as socket.create_connection does, and reaches the gateway on 127.0.0.1."""
    with HttpRail(name="sandbox", base_url=gateway.url.replace("127.0.0.1", "localhost"), timeout=5) as rail:
        assert isinstance(rail.submit(key=key, amount=100, destination="acct_1"), Paid)
