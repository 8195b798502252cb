"""ETag and If-Match: optimistic concurrency on a row's ``version``.

Responses carry ``ETag: "<version>"``. A write may send ``If-Match`` (RFC 9110 13.1.1):
``*``, or one or more entity tags, strong (``"3"``) or weak (``W/"3"``). The version is
all a tag stands for, so ``W/"3"`` names version 3 like ``"3"`` does (RFC 9110 asks for
strong comparison; proxies that compress weaken ETags, and the version is exactly the
state the precondition protects). A well-formed tag that names no current version
(``"7"`` when the row is at 8, ``"abc"``) fails the precondition: 412 version_mismatch.
A header that is not an If-Match at all (``3`` unquoted, ``"3`` unbalanced) is 400.
"""

import re
from collections.abc import Callable

from rest_framework.exceptions import ValidationError

# An entity-tag: optional W/, then a quoted opaque-tag of etagc characters (no '"').
_ETAG = r'(?:W/)?"[\x21\x23-\x7e\x80-\xff]*"'
_IF_MATCH = re.compile(rf"\*|{_ETAG}(?:[ \t]*,[ \t]*{_ETAG})*")
_TAG = re.compile(r'(?:W/)?"([^"]*)"')
_VERSION = re.compile(r"[1-9][0-9]{0,9}")  # exactly how etag() writes a version

MAX_IF_MATCH_LENGTH = 1024
# Versions start at 1: passed as the expected version, this one never matches.
NO_VERSION = 0


def etag(version: int) -> str:
    return f'"{version}"'


def with_etag(response, version: int):
    response["ETag"] = etag(version)
    return response


def if_match_versions(request) -> frozenset[int] | None:
    """The versions the request's If-Match names; None when it is absent or ``*``.
    A tag that is not a version names none (an empty set never matches)."""
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip(" \t")
    if len(value) > MAX_IF_MATCH_LENGTH or not _IF_MATCH.fullmatch(value):
        raise ValidationError(
            {"If-Match": ['Must be "*" or entity tags such as "3" (the ETag of the version you read), quoted.']}
        )
    if value == "*":
        return None
    return frozenset(int(tag) for tag in _TAG.findall(value) if _VERSION.fullmatch(tag))


def expected_version(request, *, current: Callable[[], int]) -> int | None:
    """The version a write must find (the services' ``expected_version``): None without
    a precondition, NO_VERSION when If-Match names no version that could match.
    ``current`` reads the row's version; it is called only when If-Match lists several."""
    versions = if_match_versions(request)
    if versions is None:
        return None
    if len(versions) == 1:
        return next(iter(versions))
    if not versions:
        return NO_VERSION
    # Several tags: the write proceeds if any is current. The service's CAS still
    # compares against the row, so a change in between is caught.
    version = current()
    return version if version in versions else NO_VERSION
