"""SSRF: where webhooks may go. Refusals happen before any socket opens; no test aims a
request at anything but loopback. Properties over every spelling: test_address_properties.py."""

import socket
import uuid

import pytest

from rails import addresses
from tests.api import assert_error, post
from webhooks import dispatcher, safety
from webhooks.models import Endpoint
from webhooks.safety import DeliveryRefused, WebhookURLRefused, resolve_target, validate_endpoint_url


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
    assert outcome.error == (
        "refused: internal.example resolves to 10.0.0.7 is in 10.0.0.0/8: private-use "
        "(RFC 1918, IANA special-purpose address registry)"
    )


def test_address_refusal_names_the_registry_entry():
    assert safety.address_refusal("93.184.215.14") is None
    assert safety.address_refusal("2606:2800:21f:cb07:6820:80da:af6b:8b2c") is None
    assert safety.address_refusal("::ffff:93.184.215.14") is None  # IPv4-mapped: its IPv4 address decides
    assert "127.0.0.0/8: loopback" in safety.address_refusal("127.0.0.2")
    assert "fe80::/10: link-local" in safety.address_refusal("fe80::1%eth0")
    assert safety.address_refusal("::ffff:169.254.169.254") == (
        "::ffff:a9fe:a9fe is IPv4-mapped (::ffff:0:0/96, RFC 4291) and 169.254.169.254 is in 169.254.0.0/16: "
        "link-local (cloud metadata services answer here) (RFC 3927, IANA special-purpose address registry)"
    )
    assert safety.address_refusal("2002:a9fe:a9fe::") == (
        "2002:a9fe:a9fe:: is in 2002::/16: 6to4 (RFC 3056, IANA special-purpose address registry); "
        "it wraps the IPv4 address 169.254.169.254"
    )


# --- every spelling the adversarial run stored, and the IPv6 forms this Python's ipaddress
# tables call public -------------------------------------------------------------------------

# (URL, what the refusal names)
SPELLINGS = [
    ("https://2130706433/", "127.0.0.0/8"),  # an integer
    ("https://0x7f000001/", "127.0.0.0/8"),  # hex
    ("https://0X7F000001/", "127.0.0.0/8"),
    ("https://0177.0.0.1/", "127.0.0.0/8"),  # octal
    ("https://0x7f.0.0.1/", "127.0.0.0/8"),
    ("https://127.1/", "127.0.0.0/8"),  # short forms
    ("https://127.0.1/", "127.0.0.0/8"),
    ("https://0/", "0.0.0.0/8"),
    ("https://0xa9fea9fe/", "169.254.0.0/16"),  # 169.254.169.254
    ("https://169.254.169.254./", "169.254.0.0/16"),  # trailing dot
    ("https://127.000.000.001/", "127.0.0.0/8"),  # zero-padded
    ("https://%31%32%37.0.0.1/", "127.0.0.0/8"),  # percent-encoded
    ("https://%31%32%37%2e%30%2e%30%2e%31/", "127.0.0.0/8"),
    ("https://①②⑦.0.0.1/", "127.0.0.0/8"),  # circled digits
    ("https://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11/", "127.0.0.0/8"),  # fullwidth
    ("https://127。0。0。1/", "127.0.0.0/8"),  # ideographic full stops
    ("https://1.2.3.4.5/", "not a valid IPv4 address"),
    ("https://hooks.example.999/", "not a valid IPv4 address"),
    ("https://ex%61mple.com/", "percent-encoded"),
    ("https://exa mple.com/hook", "whitespace"),  # what urlsplit would read as "example.com" or keep
    ("https://exa\nmple.com/hook", "whitespace"),
    ("https://exa\tmple.com/hook", "whitespace"),
    ("https://example.com\r\n/hook", "whitespace"),
    ("https://example.com/ho ok", "whitespace"),
    ("https://exa\u200bmple.com/hook", "whitespace"),  # zero-width space
    ("https://exa%0amples.com/hook", "whitespace"),
    ("https://exa_mple!.com/hook", "not a host name"),
    ("https://a..b/hook", "not a host name"),
    ("https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/hook", "HTTP client"),  # fullwidth: httpx refuses
    ("https://[fe80::1%25eth0]/hook", "zone"),
]
IPV6_FORMS = [
    ("https://[::]/", "::/128"),
    ("https://[::1]/", "::1/128"),
    ("https://[0:0:0:0:0:0:0:1]/", "::1/128"),
    ("https://[::ffff:127.0.0.1]/", "127.0.0.0/8"),  # IPv4-mapped: its IPv4 address
    ("https://[::FFFF:A9FE:A9FE]/", "169.254.0.0/16"),
    ("https://[::10.0.0.1]/", "::/96"),  # IPv4-compatible
    ("https://[::8.8.8.8]/", "::/96"),  # even of a public address
    ("https://[64:ff9b::a9fe:a9fe]/", "64:ff9b::/96"),  # NAT64
    ("https://[64:ff9b::8.8.8.8]/", "64:ff9b::/96"),
    ("https://[64:ff9b:1::a00:1]/", "64:ff9b:1::/48"),
    ("https://[100::1]/", "100::/64"),
    ("https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "2001::/32"),  # Teredo
    ("https://[2001:2::1]/", "2001::/23"),
    ("https://[2001:db8::1]/", "2001:db8::/32"),
    ("https://[3fff::1]/", "3fff::/20"),
    ("https://[2002:a9fe:a9fe::]/", "2002::/16"),  # 6to4 of 169.254.169.254
    ("https://[2002:7f00:1::]/", "2002::/16"),  # of 127.0.0.1
    ("https://[2002:a00:1::]/", "2002::/16"),  # of 10.0.0.1
    ("https://[2002:808:808::1]/", "2002::/16"),  # of 8.8.8.8: refused all the same
    ("https://[fc00::1]/", "fc00::/7"),
    ("https://[fd12:3456::1]/", "fc00::/7"),
    ("https://[fe80::1]/", "fe80::/10"),
    ("https://[fec0::1]/", "fec0::/10"),
    ("https://[ff02::1]/", "ff00::/8"),
    ("https://[5f00::1]/", "5f00::/16"),
    ("https://[4000::1]/", "2000::/3"),  # not allocated for global unicast
    ("https://[::ffff:0:7f00:1]/", "2000::/3"),  # IPv4-translated (SIIT)
]


# The API's field trims whitespace around the URL (what it stores has none); the function
# itself refuses it.
AROUND = [(" https://example.com/hook", "whitespace"), ("https://example.com/hook\n", "whitespace")]


@pytest.mark.parametrize(("url", "named"), SPELLINGS + IPV6_FORMS + AROUND)
def test_every_spelling_and_ipv6_form_is_refused_at_save(production, no_sockets, monkeypatch, url, named):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("resolved at save time"))
    with pytest.raises(WebhookURLRefused) as refused:
        validate_endpoint_url(url)
    assert named in refused.value.reason


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "named"), SPELLINGS + IPV6_FORMS)
def test_every_spelling_and_ipv6_form_is_400_through_the_api(production, monkeypatch, api, url, named):
    # The API's own sockets (PostgreSQL, Redis) stay; nothing resolves the URL's host.
    monkeypatch.setattr(addresses, "resolve", lambda *a, **k: pytest.fail("resolved at save time"))
    response = post(api, "/api/v1/webhook-endpoints", {"url": url, "events": ["payment.failed"]}, key=uuid.uuid4().hex)
    body = assert_error(response, 400, "validation_error")
    refusal = body["fields"]["url"][0]
    # A control or zero-width character is refused by the display-text rule first, which
    # names its code point (common/text.py); the URL rule names every other spelling.
    assert named in refusal or (named == "whitespace" and "U+" in refusal), body
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize(("url", "named"), SPELLINGS + IPV6_FORMS)
def test_every_spelling_and_ipv6_form_is_refused_at_delivery(production, no_sockets, monkeypatch, url, named):
    """A URL saved before these rules (or written to the table directly) is refused too."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("a refused host was resolved"))
    with pytest.raises(DeliveryRefused) as refused:
        dispatcher.post(url, body="{}", headers={}, timeout=1)
    assert named in str(refused.value)


@pytest.mark.parametrize("url", ["http://0x7f000001:8080/", "http://127.1:8080/", "http://127.0.0.1.:8080/",
                                 "http://%31%32%37.0.0.1:8080/", "http://①②⑦.0.0.1:8080/"])  # fmt: skip
def test_neither_debug_nor_the_allow_list_lets_a_numeric_spelling_through(settings, no_sockets, url):
    """An allow-listed host is compared in canonical form, and the spellings are refused
    before any list is read: 0x7f000001 is not "127.0.0.1 as listed"."""
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1", "localhost"]
    for debug in (False, True):
        settings.DEBUG = debug
        with pytest.raises(WebhookURLRefused):
            validate_endpoint_url(url)


def test_allow_listed_hosts_are_compared_in_canonical_form(settings, no_sockets):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["LOCALHOST.", "::1", "not a host"]
    validate_endpoint_url("http://localhost:8080/hook")
    validate_endpoint_url("http://LocalHost.:8080/hook")
    validate_endpoint_url("http://[::1]:8080/hook")
    validate_endpoint_url("http://[0:0:0:0:0:0:0:1]:8080/hook")  # the same address, compressed
    with pytest.raises(WebhookURLRefused, match="only https"):
        validate_endpoint_url("http://127.0.0.1:8080/hook")  # loopback, but not the host listed
    with pytest.raises(WebhookURLRefused, match=r"127\.0\.0\.0/8"):
        validate_endpoint_url("https://127.0.0.1/hook")


def test_an_allowed_host_resolves_and_connects_unchecked(settings, monkeypatch):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["localhost"]
    fake_dns(monkeypatch, "::1", "127.0.0.1")
    target = resolve_target("http://LOCALHOST.:8099/hook")
    assert (target.host, target.address, target.port) == ("localhost", "127.0.0.1", 8099)


def test_a_name_is_resolved_in_its_canonical_form_and_sent_so(production, monkeypatch):
    """An internationalised name is resolved as its A-label, which the Host header and the
    TLS server name carry too; a trailing dot and capitals are dropped."""
    asked = []

    def getaddrinfo(host, port, *args, **kwargs):
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert resolve_target("https://Bücher.Example./x").host == "xn--bcher-kva.example"
    assert asked == ["xn--bcher-kva.example"]

    seen = {}

    class Stop(Exception):
        pass

    def fake_stream(method, url, **kwargs):
        seen.update(url=str(url), headers=kwargs["headers"], extensions=kwargs["extensions"])
        raise Stop

    monkeypatch.setattr(dispatcher.http_client(), "stream", fake_stream)
    with pytest.raises(Stop):
        dispatcher.post("https://HOOKS.example.com./x", body="{}", headers={}, timeout=1)
    assert seen["url"] == "https://93.184.215.14/x"
    assert seen["headers"]["Host"] == "hooks.example.com"
    assert seen["extensions"] == {"sni_hostname": "hooks.example.com"}
