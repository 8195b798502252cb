"""The Idempotency-Key header at the HTTP edge: parse it, run the create once, render the
stored response. The storage and its concurrency rules are payments/idempotency.py."""

import re

from django.http import HttpResponse

from payments.exceptions import IdempotencyKeyInvalid, IdempotencyKeyRepeated, IdempotencyKeyRequired
from payments.idempotency import StoredResponse, idempotent_call, request_fingerprint

MAX_KEY_LENGTH = 255
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")
# The IETF draft's form: an RFC 8941 sf-string, where \" and \\ are the only escapes.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_SF_ESCAPE = re.compile(r'\\(["\\])')


def idempotency_key(request) -> str:
    """The request's Idempotency-Key, bare (``abc``) or quoted (``"abc"``): 1-255 printable
    ASCII characters once unquoted.

    The header is a single item (the draft's sf-string), never a list. WSGI servers join a
    header sent twice with a comma (``one,two``; ``"one","two"``), so a value that is not
    one quoted string and holds a comma is refused as repeated, not taken as one key:
    a bare key may not contain a comma (a quoted one may)."""
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        raise IdempotencyKeyRequired()
    value = raw.strip(" \t")
    quoted = _SF_STRING.fullmatch(value)
    if quoted is not None:
        key = _SF_ESCAPE.sub(r"\1", quoted.group(1))
    elif "," in value:
        raise IdempotencyKeyRepeated()
    elif value.startswith('"') or value.endswith('"'):
        raise IdempotencyKeyInvalid()  # an unbalanced quote is a client bug, not part of the key
    else:
        key = value
    if len(key) > MAX_KEY_LENGTH or not _PRINTABLE_ASCII.fullmatch(key):
        raise IdempotencyKeyInvalid()
    return key


def stored_response(stored: StoredResponse) -> HttpResponse:
    """The stored body byte-for-byte, first time and on every replay."""
    response = HttpResponse(stored.body, status=stored.status, content_type="application/json")
    if stored.replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def run_idempotent(request, create) -> HttpResponse:
    """Run ``create`` (which returns ``(status, rendered body)``) once per actor and key."""
    key = idempotency_key(request)
    fingerprint = request_fingerprint(method=request.method, path=request.path, body=request.data)
    return stored_response(idempotent_call(actor=request.user, key=key, fingerprint=fingerprint, create=create))
