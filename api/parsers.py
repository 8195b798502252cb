"""JSON request bodies, strictly: exactly ``application/json``, bounded in size, no
duplicate keys, no lone surrogates."""

import json
import re

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser, get_encoding
from rest_framework.renderers import JSONRenderer
from rest_framework.settings import api_settings
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


class StrictJSONParser(BaseParser):
    """DRF's JSONParser plus the limits a payments API needs.

    * Bodies over ``DELAYPAY_MAX_BODY_BYTES`` get 413 (judged on Content-Length before
      reading, and on the bytes actually read).
    * Duplicate object keys, lone UTF-16 surrogates and nesting deep enough to exhaust
      the parser's recursion are 400 ``parse_error``, never a 500.

    Not a JSONParser subclass on purpose: DRF hands a JSONParser ``request.body``, read
    whole (up to Django's 2.5 MiB DATA_UPLOAD_MAX_MEMORY_SIZE, beyond which Django raises
    RequestDataTooBig) before the parser can judge the size. This one gets the stream
    and reads at most the limit plus one byte.
    """

    media_type = "application/json"
    renderer_class = JSONRenderer
    strict = api_settings.STRICT_JSON

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


# A media type's type and subtype: RFC 9110 tokens.
_TCHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_CONTENT_TYPE = re.compile(
    rf"[ \t]*(?P<type>{_TCHARS}/{_TCHARS})(?P<params>(?:[ \t]*;[ \t]*(?:{_TCHARS}=(?:{_TCHARS}|{_QUOTED}))?)*)[ \t]*"
)
_PARAM = re.compile(rf"({_TCHARS})=")
# Parameters a body's Content-Type may carry; anything else names another format.
_ALLOWED_PARAMS = {"charset"}


def exact_media_type(content_type: str) -> str | None:
    """``type/subtype`` (lower case) of a Content-Type that names one media type, with at
    most one ``charset`` parameter; None for anything else (wildcards match no parser)."""
    match = _CONTENT_TYPE.fullmatch(content_type or "")
    if match is None:
        return None
    params = [name.lower() for name in _PARAM.findall(re.sub(_QUOTED, '""', match["params"]))]
    if len(params) != len(set(params)) or not set(params) <= _ALLOWED_PARAMS:
        return None
    return match["type"].lower()


class StrictContentNegotiation(DefaultContentNegotiation):
    """A body is parsed only when its Content-Type names a parser's media type exactly.

    DRF's default matches the header as a pattern, so ``*/*`` and ``application/*`` pick
    the JSON parser; here they, and ``application/json`` with parameters other than
    ``charset``, are 415 ``unsupported_media_type``. Responses are negotiated as DRF does.
    """

    def select_parser(self, request, parsers):
        content_type = request.content_type
        if content_type and len(content_type) > self.max_media_type_length:
            return None
        media_type = exact_media_type(content_type)
        return next((parser for parser in parsers if parser.media_type == media_type), None)
