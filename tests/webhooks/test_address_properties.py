"""Properties of the SSRF rules (rails/addresses.py, webhooks/safety.py): an address drawn
from every network of the IANA special-purpose registries, written in every spelling a
resolver or URL parser reads as that address, is refused at save time and at delivery
before any socket opens; a public address in canonical form is accepted, and in any other
spelling refused.

The networks are written out here again, from the registries, rather than read from the
module's tables: the test states the rule, the module implements it."""

import ipaddress
import socket
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from rails import addresses
from tests.scale import scaled
from webhooks import dispatcher
from webhooks.safety import DeliveryRefused, WebhookURLRefused, validate_endpoint_url

PER_NETWORK = hypothesis_settings(max_examples=scaled(40), suppress_health_check=[HealthCheck.function_scoped_fixture])
PROPERTY = hypothesis_settings(max_examples=scaled(200), suppress_health_check=[HealthCheck.function_scoped_fixture])

IPV4_REFUSED = [ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
)]  # fmt: skip
# IPv4-mapped (::ffff:0:0/96) is not here: its IPv4 address decides (the wrappings below).
IPV6_REFUSED = [ipaddress.IPv6Network(n) for n in (
    "::/128", "::1/128", "::/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001::/32",
    "2001:db8::/32", "3fff::/20", "2002::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "5f00::/16",
)]  # fmt: skip
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def refused_v4(value: int) -> bool:
    return any(value in range(int(n.network_address), int(n.broadcast_address) + 1) for n in IPV4_REFUSED)


def refused_v6(value: int) -> bool:
    ip = ipaddress.IPv6Address(value)
    return ip not in GLOBAL_UNICAST or any(ip in n for n in IPV6_REFUSED)


def addresses_in(network) -> st.SearchStrategy[int]:
    return st.integers(int(network.network_address), int(network.broadcast_address))


public_v4 = st.integers(0, 2**32 - 1).filter(lambda v: not refused_v4(v))
public_v6 = addresses_in(GLOBAL_UNICAST).filter(lambda v: not refused_v6(v))


# --- spellings of an IPv4 address ------------------------------------------------------------


def _octets(value: int) -> list[int]:
    return list(ipaddress.IPv4Address(value).packed)


def dotted(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


def _digits(text: str, zero: str, one_to_nine: str) -> str:
    return "".join((zero + one_to_nine)[int(c)] if c.isdigit() else c for c in text)


CIRCLED = "".join(chr(0x2460 + n) for n in range(9))  # ① to ⑨
FULLWIDTH = "".join(chr(0xFF11 + n) for n in range(9))  # fullwidth one to nine


def _hex_pair(value: int) -> str:
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


# Each: an IPv4 address as a URL's host, in a spelling some parser or resolver reads as it.
TEXT_SPELLINGS = {
    "integer": lambda v: str(v),
    "hex": lambda v: hex(v),
    "octal parts": lambda v: ".".join("0" + format(o, "o") for o in _octets(v)),
    "hex parts": lambda v: ".".join(hex(o) for o in _octets(v)),
    "mixed parts": lambda v: f"{hex(_octets(v)[0])}.0{format(_octets(v)[1], 'o')}.{_octets(v)[2]}.{_octets(v)[3]}",
    "three parts": lambda v: f"{v >> 24}.{(v >> 16) & 0xFF}.{v & 0xFFFF}",
    "two parts": lambda v: f"{v >> 24}.{v & 0xFFFFFF}",
    "two parts, hex": lambda v: f"{v >> 24}.{hex(v & 0xFFFFFF)}",
    "zero-padded": lambda v: ".".join(f"{o:04d}" for o in _octets(v)),
    "percent-encoded": lambda v: "".join(f"%{ord(c):02X}" for c in dotted(v)),
    "percent-encoded digits": lambda v: "".join(f"%{ord(c):02x}" if c.isdigit() else c for c in dotted(v)),
    "fullwidth digits": lambda v: _digits(dotted(v), "\uff10", FULLWIDTH),
    "fullwidth digits and dots": lambda v: _digits(dotted(v), "\uff10", FULLWIDTH).replace(".", "\uff0e"),
    "circled digits": lambda v: _digits(dotted(v), "⓪", CIRCLED),
    "ideographic dots": lambda v: dotted(v).replace(".", "。"),
    "trailing dot": lambda v: dotted(v) + ".",
}
WRAPPINGS = {
    "IPv4-mapped": lambda v: f"[::ffff:{dotted(v)}]",
    "IPv4-mapped, hex": lambda v: f"[::ffff:{_hex_pair(v)}]",
    "IPv4-mapped, full": lambda v: f"[0:0:0:0:0:ffff:{_hex_pair(v)}]",
    "IPv4-compatible": lambda v: f"[::{dotted(v)}]",
    "6to4": lambda v: f"[2002:{_hex_pair(v)}::1]",
    "NAT64": lambda v: f"[64:ff9b::{dotted(v)}]",
    "NAT64 local-use": lambda v: f"[64:ff9b:1::{_hex_pair(v)}]",
    "Teredo": lambda v: f"[2001:0:4136:e378:8000:63bf:{_hex_pair(v ^ 0xFFFFFFFF)}]",  # the client, obfuscated
}


@st.composite
def spelled_v4(draw, value: int, spellings: dict) -> str:
    """``value`` in one of ``spellings``, perhaps upper-cased."""
    host = spellings[draw(st.sampled_from(sorted(spellings)))](value)
    return host.upper() if draw(st.booleans()) else host


# --- spellings of an IPv6 address ------------------------------------------------------------


def _v6_spellings(value: int) -> list[str]:
    ip = ipaddress.IPv6Address(value)
    groups = ip.exploded.split(":")
    return [
        ip.compressed,
        ip.exploded,
        ip.compressed.upper(),
        ":".join(g.lstrip("0") or "0" for g in groups),
        ":".join(groups[:6]) + ":" + dotted(value & 0xFFFFFFFF),  # the last 32 bits as a dotted quad
    ]


# --- the checks ------------------------------------------------------------------------------


@pytest.fixture
def production(settings):
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = []


def no_resolution(*args, **kwargs):
    raise AssertionError("resolved at save time")


@contextmanager
def dns_answering(address: str):
    """Every name resolves to ``address`` while inside."""

    def getaddrinfo(host, port, *args, **kwargs):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    with mock.patch.object(socket, "getaddrinfo", getaddrinfo):
        yield


def assert_refused_at_save(host: str) -> str:
    with mock.patch.object(socket, "getaddrinfo", no_resolution), pytest.raises(WebhookURLRefused) as refused:
        validate_endpoint_url(f"https://{host}/hook")
    return refused.value.reason


def names_its_entry(reason: str, ip, networks) -> bool:
    return any(f"{network}:" in reason for network in networks if ip in network)


@pytest.mark.parametrize("network", IPV4_REFUSED, ids=str)
@PER_NETWORK
@given(data=st.data())
def test_a_refused_ipv4_address_is_refused_in_every_spelling(production, no_sockets, network, data):
    value = data.draw(addresses_in(network), label="address")
    reason = assert_refused_at_save(dotted(value))
    assert names_its_entry(reason, ipaddress.IPv4Address(value), IPV4_REFUSED), reason
    assert_refused_at_save(data.draw(spelled_v4(value, TEXT_SPELLINGS | WRAPPINGS), label="spelling"))


@pytest.mark.parametrize("network", IPV6_REFUSED, ids=str)
@PER_NETWORK
@given(data=st.data())
def test_a_refused_ipv6_address_is_refused_in_every_spelling(production, no_sockets, network, data):
    value = data.draw(addresses_in(network), label="address")
    spelling = data.draw(st.sampled_from(_v6_spellings(value)), label="spelling")
    reason = assert_refused_at_save(f"[{spelling}]")
    assert names_its_entry(reason, ipaddress.IPv6Address(value), IPV6_REFUSED), reason
    assert addresses.address_refusal(spelling) == reason


@PROPERTY
@given(value=public_v6, top=st.sampled_from([0b000, 0b010, 0b011, 0b100, 0b101, 0b110, 0b111]))
def test_an_ipv6_address_outside_global_unicast_is_refused(production, no_sockets, value, top):
    """Only 2000::/3 is allocated for global unicast: a public address moved out of it (its
    top three bits changed) is refused, named or not by a registry entry."""
    outside = ipaddress.IPv6Address(value & ((1 << 125) - 1) | top << 125)
    assume(outside not in ipaddress.IPv6Network("::ffff:0:0/96"))  # IPv4-mapped: its IPv4 address decides
    assert assert_refused_at_save(f"[{outside}]")


@PROPERTY
@given(value=public_v4, data=st.data())
def test_a_public_ipv4_address_is_accepted_only_as_a_dotted_quad(production, no_sockets, value, data):
    with mock.patch.object(socket, "getaddrinfo", no_resolution):
        validate_endpoint_url(f"https://{dotted(value)}/hook")
        validate_endpoint_url(f"https://[::ffff:{dotted(value)}]/hook")  # IPv4-mapped: its IPv4 address decides
    assert addresses.address_refusal(dotted(value)) is None
    spelling = data.draw(spelled_v4(value, TEXT_SPELLINGS), label="spelling")
    assert assert_refused_at_save(spelling)


@PROPERTY
@given(value=public_v6, data=st.data())
def test_a_public_ipv6_address_is_accepted(production, no_sockets, value, data):
    spelling = data.draw(st.sampled_from(_v6_spellings(value)), label="spelling")
    with mock.patch.object(socket, "getaddrinfo", no_resolution):
        validate_endpoint_url(f"https://[{spelling}]/hook")
    assert addresses.address_refusal(spelling) is None


refused_address = st.one_of(
    st.sampled_from(IPV4_REFUSED).flatmap(addresses_in).map(dotted),
    st.sampled_from(IPV6_REFUSED).flatmap(addresses_in).map(lambda v: str(ipaddress.IPv6Address(v))),
    st.sampled_from(IPV4_REFUSED).flatmap(addresses_in).map(lambda v: f"::ffff:{dotted(v)}"),
    st.sampled_from(["fe80::1%eth0", "fe80::abcd%2"]),  # link-local with a zone, as getaddrinfo gives it
)


@PROPERTY
@given(address=refused_address, public=public_v4)
def test_a_name_resolving_to_a_refused_address_is_refused_before_any_socket(production, no_sockets, address, public):
    """At delivery the name is resolved, every address checked, and nothing connects: alone
    or beside a public address, whichever a client would pick."""
    url = "https://hooks.example.com/hook"
    validate_endpoint_url(url)  # a name: accepted at save, checked at delivery
    with dns_answering(address), pytest.raises(DeliveryRefused, match=r"hooks\.example\.com resolves to "):
        dispatcher.post(url, body="{}", headers={}, timeout=1)

    def both(host, port, *args, **kwargs):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (dotted(public), port)),
                (family, socket.SOCK_STREAM, 6, "", (address, port))]  # fmt: skip

    with mock.patch.object(socket, "getaddrinfo", both), pytest.raises(DeliveryRefused):
        dispatcher.post(url, body="{}", headers={}, timeout=1)


@PROPERTY
@given(value=addresses_in(IPV4_REFUSED[3]), data=st.data())
def test_the_allow_list_lets_through_only_the_host_as_listed(settings, no_sockets, value, data):
    """127.0.0.1 listed: that dotted quad may be used, no other spelling of it (nor another
    loopback address)."""
    settings.DEBUG = False
    settings.DELAYPAY_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1", "localhost"]
    if value == int(ipaddress.IPv4Address("127.0.0.1")):
        validate_endpoint_url("http://127.0.0.1:8099/hook")
    else:
        assert assert_refused_at_save(dotted(value))
    assert assert_refused_at_save(data.draw(spelled_v4(value, TEXT_SPELLINGS | WRAPPINGS), label="spelling"))
