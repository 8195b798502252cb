"""JSON request bodies, strictly: bounded in size, no duplicate keys, no lone surrogates."""

import json

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils.json import strict_constant


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"

    def __init__(self, limit: int):
        super().__init__(f"The request body is larger than {limit} bytes.")


def _reject_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            # {"amount": 1, "amount": 1000} means two things; refuse to pick one.
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


class StrictJSONParser(JSONParser):
    """DRF's JSONParser plus the limits a payments API needs.

    * Bodies over ``DELAYPAY_MAX_BODY_BYTES`` get 413 (judged on Content-Length before
      reading, and on the bytes actually read).
    * Duplicate object keys, lone UTF-16 surrogates and nesting deep enough to exhaust
      the parser's recursion are 400 ``parse_error``, never a 500.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        limit = settings.DELAYPAY_MAX_BODY_BYTES
        request = parser_context.get("request")
        meta = request.META if request is not None else {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise PayloadTooLarge(limit)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(limit)

        encoding = get_encoding(parser_context)  # text codecs only (no bz2 bombs)
        try:
            data = json.loads(
                raw.decode(encoding),
                parse_constant=strict_constant if self.strict else None,
                object_pairs_hook=_reject_duplicate_keys,
            )
            # Lone surrogates ("\ud800") parse but cannot be stored or rendered as UTF-8.
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except (ValueError, UnicodeError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        return data
