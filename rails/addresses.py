"""Which hosts and addresses the product may connect to (SSRF): a host normaliser and the
IANA special-purpose address registries, written out here.

Shared by webhooks/safety.py (endpoint URLs) and rails/http.py (a rail's URL). The
registries are our own tables, not ``ipaddress``'s ``is_private``/``is_global``, whose
answers differ between Python versions (6to4 wrapping a private address, ``fec0::/10``,
``3fff::/20`` were public to some); ``ipaddress`` only parses and compares here.

A host is read the way a resolver reads it, and refused when the reading is ambiguous:

* percent-decoded, Unicode NFKC-normalised (fullwidth and circled digits become ASCII
  digits, fullwidth and ideographic full stops become dots), lower-cased, one trailing
  dot dropped, a name outside ASCII IDNA-encoded as httpx encodes it (UTS 46, IDNA 2008);
* a host whose last label is then a number (decimal digits, or ``0x`` and hex digits) is
  an IPv4 address to a resolver: inet_aton reads ``2130706433``, ``0x7f000001``,
  ``0177.0.0.1``, ``127.1`` and ``0`` as addresses. Only four decimal numbers without
  leading zeros, written so (no trailing dot, no percent-encoding, no look-alike digits),
  are taken as an IPv4 address; every other numeric spelling is refused, whatever address
  it names, and the message says which address that is;
* an IPv6 address only in brackets, without a zone;
* anything else is a name: letters, digits, hyphens and underscores, labels of 1 to 63
  characters, 253 in all. Whitespace, control characters and percent-encoding are refused.

Django-free (``rails`` imports nothing of ours); ``idna`` comes with httpx.
"""

import ipaddress
import re
import socket
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import SplitResult, unquote, urlsplit

import idna

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Special:
    """An entry of an IANA special-purpose address registry that may not be connected to."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    name: str
    source: str


def _table(*rows: tuple[str, str, str]) -> tuple[Special, ...]:
    return tuple(Special(ipaddress.ip_network(network), name, source) for network, name, source in rows)


# IANA IPv4 Special-Purpose Address Registry, the entries not globally reachable, and
# multicast (IPv4 Address Space Registry). The most specific entry comes first.
IPV4_DENYLIST = _table(
    ("0.0.0.0/8", "this network", "RFC 791"),
    ("10.0.0.0/8", "private-use", "RFC 1918"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)", "RFC 6598"),
    ("127.0.0.0/8", "loopback", "RFC 1122"),
    ("169.254.0.0/16", "link-local (cloud metadata services answer here)", "RFC 3927"),
    ("172.16.0.0/12", "private-use", "RFC 1918"),
    ("192.0.0.0/24", "IETF protocol assignments", "RFC 6890"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)", "RFC 5737"),
    ("192.88.99.0/24", "6to4 relay anycast (deprecated)", "RFC 7526"),
    ("192.168.0.0/16", "private-use", "RFC 1918"),
    ("198.18.0.0/15", "benchmarking", "RFC 2544"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)", "RFC 5737"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)", "RFC 5737"),
    ("224.0.0.0/4", "multicast", "RFC 5771"),
    ("255.255.255.255/32", "limited broadcast", "RFC 919"),
    ("240.0.0.0/4", "reserved", "RFC 1112"),
)

# IANA IPv6 Special-Purpose Address Registry (and multicast, site-local). An address
# wrapping an IPv4 one is refused outright, except IPv4-mapped (a dual-stack socket
# connects to the IPv4 address itself), whose IPv4 address is checked instead.
IPV4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
IPV6_DENYLIST = _table(
    ("::/128", "unspecified", "RFC 4291"),
    ("::1/128", "loopback", "RFC 4291"),
    ("::/96", "IPv4-compatible (deprecated)", "RFC 4291"),
    ("64:ff9b::/96", "IPv4/IPv6 translation (NAT64)", "RFC 6052"),
    ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation (NAT64)", "RFC 8215"),
    ("100::/64", "discard-only", "RFC 6666"),
    ("2001::/32", "Teredo", "RFC 4380"),
    ("2001::/23", "IETF protocol assignments", "RFC 2928"),
    ("2001:db8::/32", "documentation", "RFC 3849"),
    ("2002::/16", "6to4", "RFC 3056"),
    ("3fff::/20", "documentation", "RFC 9637"),
    ("5f00::/16", "segment routing (SRv6) SIDs", "RFC 9602"),
    ("fc00::/7", "unique local", "RFC 4193"),
    ("fe80::/10", "link-local", "RFC 4291"),
    ("fec0::/10", "site-local (deprecated)", "RFC 3879"),
    ("ff00::/8", "multicast", "RFC 4291"),
)
# Outside it nothing is allocated for global unicast (IANA IPv6 Address Space Registry):
# this also refuses the wrappings and translations no registry entry above names.
IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

# Names that are loopback whatever DNS says (RFC 6761, /etc/hosts conventions).
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_DOTTED_QUAD = re.compile(r"(?:0|[1-9][0-9]{0,2})(?:\.(?:0|[1-9][0-9]{0,2})){3}")
# Control, format (zero-width, soft hyphen, bidi), surrogate and space characters.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


class Refused(ValueError):
    """A host, address or URL the rules refuse; ``str()`` says why."""


@dataclass(frozen=True)
class Host:
    """A host as a resolver reads it: ``name`` in canonical form (lower-case ASCII,
    A-labels, no trailing dot; an IP address in its compressed form, IPv6 without
    brackets) and ``ip`` when it is an address."""

    name: str
    ip: IPAddress | None = None


def _shown(text: str) -> str:
    """``text`` for a message: what cannot be printed escaped."""
    return "".join(
        c if c.isprintable() and unicodedata.category(c) not in _UNSAFE_CATEGORIES else f"\\u{ord(c):04x}" for c in text
    )


def has_unsafe_characters(text: str) -> bool:
    """Whether ``text`` holds whitespace or a control or format character (which URL
    parsers strip, skip or read differently)."""
    return any(unicodedata.category(c) in _UNSAFE_CATEGORIES for c in text)


def _entry(ip: IPAddress, table: tuple[Special, ...]) -> Special | None:
    return next((entry for entry in table if ip in entry.network), None)


def _entry_refusal(ip: IPAddress, entry: Special) -> str:
    return f"{ip} is in {entry.network}: {entry.name} ({entry.source}, IANA special-purpose address registry)"


# Entries whose addresses wrap an IPv4 address: a refusal names it.
_WRAPPING = frozenset(
    ipaddress.IPv6Network(n) for n in ("::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32", "2002::/16")
)


def _wrapped_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    """The IPv4 address an IPv4-compatible, NAT64, 6to4 or Teredo address wraps."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's address
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


def address_refusal(address: str | IPAddress) -> str | None:
    """Why ``address`` may not be connected to (the registry entry it falls in), or None
    when it may. ``ValueError`` when it is not an IP address (a zone, ``%eth0``, is dropped)."""
    ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        entry = _entry(ip, IPV4_DENYLIST)
        return _entry_refusal(ip, entry) if entry else None
    if ip.scope_id is not None:
        ip = ipaddress.IPv6Address(int(ip))
    if ip in IPV4_MAPPED:
        mapped = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        entry = _entry(mapped, IPV4_DENYLIST)
        return f"{ip} is IPv4-mapped ({IPV4_MAPPED}, RFC 4291) and {_entry_refusal(mapped, entry)}" if entry else None
    entry = _entry(ip, IPV6_DENYLIST)
    if entry is None:
        if ip in IPV6_GLOBAL_UNICAST:
            return None
        return f"{ip} is outside {IPV6_GLOBAL_UNICAST}, the only IPv6 block allocated for global unicast (IANA)"
    reason = _entry_refusal(ip, entry)
    return f"{reason}; it wraps the IPv4 address {_wrapped_ipv4(ip)}" if entry.network in _WRAPPING else reason


def _inet_aton(labels: list[str]) -> ipaddress.IPv4Address | None:
    """The address inet_aton (and so a resolver) reads in numeric ``labels``, or None."""
    if not 1 <= len(labels) <= 4:
        return None
    numbers = []
    for label in labels:
        try:
            if label.startswith("0x"):
                numbers.append(int(label[2:] or "0", 16))
            elif len(label) > 1 and label.startswith("0"):
                numbers.append(int(label, 8))
            else:
                numbers.append(int(label, 10))
        except ValueError:
            return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    return ipaddress.IPv4Address(sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last)


def _ipv6_literal(raw: str) -> Host:
    inner = raw[1:-1] if raw.endswith("]") else None
    if inner is None or "%" in inner or not re.fullmatch(r"[0-9A-Fa-f:.]+", inner):
        raise Refused(f"{_shown(raw)} is not an IPv6 address in brackets (a zone, %..., is not allowed)")
    try:
        ip = ipaddress.IPv6Address(inner)
    except ValueError:
        raise Refused(f"{_shown(raw)} is not an IPv6 address") from None
    return Host(name=ip.compressed, ip=ip)


def _name(text: str, shown: str) -> str:
    """``text`` (percent-decoded) as a resolver's ASCII name, its labels checked."""
    text = unicodedata.normalize("NFKC", text).replace("\u3002", ".").lower()
    if text.endswith("."):
        text = text[:-1]
    if not text.isascii():
        try:
            text = idna.encode(text, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise Refused(f"{shown} is not a valid internationalised host name") from None
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise Refused(f"{shown} is not a host name (letters, digits, hyphens, dots; labels of 1 to 63 characters)")
    return text


def normalise_host(raw: str) -> Host:
    """``raw`` (a URL's host as written, IPv6 in brackets) as a resolver reads it;
    ``Refused`` when it is not a host name, a dotted-quad IPv4 address or a bracketed IPv6
    address, including every other spelling a resolver would read as an IPv4 address."""
    shown = _shown(raw)
    if not raw:
        raise Refused("the URL has no host")
    if raw.startswith("["):
        return _ipv6_literal(raw)
    try:
        decoded = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise Refused(f"{shown} is percent-encoded bytes that are not UTF-8") from None
    if has_unsafe_characters(decoded):
        raise Refused(f"{_shown(decoded)} holds whitespace or a control character")
    name = _name(decoded, shown)
    labels = name.split(".")
    host = Host(name=name)
    if _NUMBER.fullmatch(labels[-1]):
        # Written as the dotted quad itself: no trailing dot, no look-alike digits.
        canonical = raw.lower() == name and _DOTTED_QUAD.fullmatch(name) and all(int(n) <= 255 for n in labels)
        if not canonical:
            read = _inet_aton(labels)
            if read is None:
                raise Refused(f"{shown} is not a valid IPv4 address (a host whose last label is a number is one)")
            reason = address_refusal(read)
            raise Refused(
                f"{shown} is a non-canonical spelling of the IPv4 address {read}: write IPv4 addresses as four "
                "decimal numbers without leading zeros" + (f"; {reason}" if reason else "")
            )
        host = Host(name=name, ip=ipaddress.IPv4Address(name))
    if decoded != raw:
        reason = host_refusal(host)
        raise Refused(
            f"{shown} is percent-encoded ({host.name}): write the host as it is" + (f"; {reason}" if reason else "")
        )
    return host


def host_refusal(host: Host) -> str | None:
    """Why ``host`` may not be connected to before any resolution (an address in a
    registry, a loopback name), or None; a name's addresses are checked once resolved."""
    if host.ip is not None:
        return address_refusal(host.ip)
    if host.name in LOCAL_NAMES or host.name.endswith(".localhost"):
        return f"{host.name} is a loopback name (RFC 6761)"
    return None


def allow_list(entries: Iterable[str]) -> frozenset[str]:
    """The canonical names of allow-listed hosts (``127.0.0.1``, ``localhost``, ``::1`` or
    ``[::1]``). A URL's host is allowed when its canonical name is one of them: the same
    name written otherwise (``LOCALHOST``, ``localhost.``, ``[0:0::1]``) is; a numeric
    spelling of a listed address (``0x7f000001``, ``127.1``, ``127.0.0.1.``) is not, it is
    refused before any list is read. An entry that does not normalise matches nothing."""
    return _allow_list(tuple(entries))


@lru_cache(maxsize=16)
def _allow_list(entries: tuple[str, ...]) -> frozenset[str]:
    names = set()
    for entry in entries:
        entry = entry.strip()
        try:
            names.add(normalise_host(f"[{entry}]" if ":" in entry and not entry.startswith("[") else entry).name)
        except Refused:
            continue
    return frozenset(names)


def _raw_host(netloc: str) -> str:
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):
        return hostport[: hostport.find("]") + 1]
    return hostport.partition(":")[0]


def split_url(url: str) -> tuple[SplitResult, Host, int]:
    """An ``http(s)://`` URL's parts, its host normalised and its port; ``Refused`` when it
    is not one, holds credentials, whitespace or control characters, or its host does
    not normalise."""
    if has_unsafe_characters(url):
        raise Refused("whitespace and control characters are not allowed in a URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not _raw_host(parts.netloc):
        raise Refused("the URL must be https://host/...")
    if parts.username is not None or parts.password is not None:
        raise Refused("credentials in the URL are not allowed")
    host = normalise_host(_raw_host(parts.netloc))
    return parts, host, port if port is not None else (443 if parts.scheme == "https" else 80)


def resolve(host: Host, port: int, *, allowed: Callable[[Host], bool] = lambda host: False) -> list[str]:
    """The addresses to connect to for ``host``, in the resolver's order, each checked
    (``Refused`` when any one is refused: whichever a client picked), or unchecked for an
    ``allowed`` host. ``OSError`` when the name does not resolve."""
    checked = not allowed(host)
    if checked and (reason := host_refusal(host)):
        raise Refused(reason)
    infos = socket.getaddrinfo(host.name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found = list(dict.fromkeys(info[4][0] for info in infos))
    if not found:
        raise OSError(f"{host.name} resolves to no address")
    if checked:
        for address in found:
            if reason := address_refusal(address):
                raise Refused(f"{host.name} resolves to {reason}")
    return found
