"""SSRF: where webhooks may go. Refusals happen before any socket opens; no test aims a
request at anything but loopback."""

import socket

import pytest

from webhooks import dispatcher, safety
from webhooks.safety import DeliveryRefused, WebhookURLRefused, resolve_target, validate_endpoint_url


@pytest.fixture
def no_sockets(monkeypatch):
    """Fail the test if anything tries to connect."""

    def refuse(self, address):
        raise AssertionError(f"a socket was opened to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def production(settings):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = []


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/hook",  # not https
        "https://127.0.0.1/hook",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",  # loopback mapped into IPv6
        "https://10.1.2.3/hook",
        "https://192.168.0.1/hook",
        "https://172.16.5.4/hook",
        "https://169.254.169.254/latest/meta-data",  # cloud metadata
        "https://100.64.0.1/hook",  # shared address space
        "https://0.0.0.0/hook",
        "https://224.0.0.1/hook",
        "https://localhost/hook",
        "https://api.localhost/hook",
        "https://user:pw@example.com/hook",
        "ftp://example.com/hook",
        "https:///hook",
        "https://example.com:99999/hook",
    ],
)
def test_unsafe_urls_are_refused_at_save(production, no_sockets, url):
    with pytest.raises(WebhookURLRefused) as refused:
        validate_endpoint_url(url)
    assert refused.value.code == "validation_error" and "url" in refused.value.fields


def test_a_public_https_url_is_accepted_without_resolving_it(production, no_sockets, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("resolved at save time"))
    validate_endpoint_url("https://hooks.example.com/delaypay?x=1")
    validate_endpoint_url("https://93.184.215.14:8443/hook")


def test_allowed_hosts_and_debug_may_use_http_and_loopback(settings, no_sockets):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    validate_endpoint_url("http://127.0.0.1:8080/hook")
    with pytest.raises(WebhookURLRefused):
        validate_endpoint_url("http://localhost:8080/hook")
    settings.DEBUG = True
    validate_endpoint_url("http://localhost:8080/hook")


def fake_dns(monkeypatch, *addresses):
    def getaddrinfo(host, port, *args, **kwargs):
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    "addresses",
    [("127.0.0.1",), ("10.0.0.7",), ("169.254.169.254",), ("::1",), ("93.184.215.14", "192.168.1.1")],
)
def test_a_name_resolving_to_a_private_address_is_refused_at_delivery(production, no_sockets, monkeypatch, addresses):
    fake_dns(monkeypatch, *addresses)
    with pytest.raises(DeliveryRefused):
        resolve_target("https://rebinding.example/hook")


def test_the_connection_goes_to_the_checked_address_with_host_and_sni(production, monkeypatch):
    """DNS rebinding: the request goes to the address that was checked, not to what a
    second lookup might say; the URL's host rides in the Host header and TLS's SNI."""
    fake_dns(monkeypatch, "93.184.215.14")
    target = resolve_target("https://hooks.example.com:8443/x")
    assert (target.host, target.address, target.port) == ("hooks.example.com", "93.184.215.14", 8443)

    seen = {}

    class Stop(Exception):
        pass

    def fake_stream(method, url, **kwargs):
        seen.update(url=str(url), headers=kwargs["headers"], extensions=kwargs["extensions"])
        raise Stop

    monkeypatch.setattr(dispatcher.http_client(), "stream", fake_stream)
    with pytest.raises(Stop):
        dispatcher.post("https://hooks.example.com:8443/x", body="{}", headers={}, timeout=1)
    assert seen["url"] == "https://93.184.215.14:8443/x"
    assert seen["headers"]["Host"] == "hooks.example.com:8443"
    assert seen["extensions"] == {"sni_hostname": "hooks.example.com"}


def test_a_refused_delivery_is_a_failed_try_without_a_socket(production, no_sockets, monkeypatch):
    fake_dns(monkeypatch, "10.0.0.7")
    claimed = dispatcher.Claimed(
        id=1, attempts=0, lease_until=None, event_id=1, type="payment.executed", created_at=None, snapshot={},
        payment_id="pay_x", recurring_id=None, endpoint_id="whe_x", url="https://internal.example/hook",
        enabled=True, secrets=("whsec_" + "A" * 32,),
    )  # fmt: skip
    outcome = dispatcher.deliver(claimed, body="{}", timeout=1)
    assert outcome.status_code is None
    assert outcome.error.startswith("refused: internal.example resolves to 10.0.0.7 is a private address")


def test_address_refusal_names_the_reason():
    assert safety.address_refusal("93.184.215.14") is None
    assert safety.address_refusal("2606:2800:21f:cb07:6820:80da:af6b:8b2c") is None
    assert "loopback" in safety.address_refusal("127.0.0.2")
    assert "link-local" in safety.address_refusal("fe80::1%eth0")
