"""Cursor pagination on a unique composite key: ``{"items": [...], "next_cursor": ...}``.

DRF's CursorPagination positions a cursor on the first ordering field only and skips
ties with an offset. Payments share ``execute_at`` all the time (every rent payment is
due at midnight), and a payment inserted with the same ``execute_at`` while a client
pages would shift that offset and repeat or skip a row. This subclass keeps DRF's
opaque base64 cursor but makes the position the whole ordering key (for example
``(execute_at, id)``), so the next page is a plain keyset query
``(execute_at, id) < (last execute_at, last id)``: rows that exist for the whole walk
are returned exactly once, in order, whatever is inserted meanwhile.
"""

import json
from base64 import b64encode
from datetime import datetime
from types import SimpleNamespace
from urllib import parse

from django.db import models
from django.db.models import Q
from django.http import QueryDict
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.response import Response

from payments.fields import format_utc, parse_rfc3339

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_CURSOR_LENGTH = 512


class KeysetCursorPagination(CursorPagination):
    page_size = DEFAULT_LIMIT
    max_page_size = MAX_LIMIT
    page_size_query_param = "limit"
    cursor_query_param = "cursor"
    template = None

    def __init__(self, *, ordering: tuple[str, ...]):
        directions = {name.startswith("-") for name in ordering}
        if len(directions) != 1:
            raise ValueError("every ordering field must sort the same way")
        self.ordering = ordering

    # --- request side -----------------------------------------------------------------

    def get_page_size(self, request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({"limit": [f"Must be an integer between 1 and {self.max_page_size}."]})
        return int(raw)

    def decode_cursor(self, request):
        raw = request.query_params.get(self.cursor_query_param)
        if raw is not None and len(raw) > MAX_CURSOR_LENGTH:
            raise ValidationError({"cursor": ["Invalid cursor."]})
        try:
            cursor = super().decode_cursor(request)
        except (NotFound, UnicodeError, ValueError):
            cursor = False
        if cursor is None:
            return None
        try:
            if cursor is False or cursor.offset or cursor.reverse or cursor.position is None:
                raise ValueError
            values = json.loads(cursor.position)
            if not isinstance(values, list) or len(values) != len(self.ordering):
                raise ValueError
            return Cursor(offset=0, reverse=False, position=values)
        except (ValueError, RecursionError):
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None

    def encode_cursor(self, cursor) -> str:
        """Just the opaque token (DRF returns a whole URL)."""
        querystring = parse.urlencode({"p": cursor.position})
        return b64encode(querystring.encode("ascii")).decode("ascii")

    # --- the keyset query -------------------------------------------------------------

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        limit = self.get_page_size(request)
        self.cursor = self.decode_cursor(request)
        queryset = queryset.order_by(*self.ordering)
        if self.cursor is not None:
            queryset = queryset.filter(self._after(queryset.model, self.cursor.position))
        rows = list(queryset[: limit + 1])
        self.page = rows[:limit]
        self.has_next = len(rows) > limit
        return self.page

    def _after(self, model, encoded: list) -> Q:
        """Rows strictly after the cursor in the ordering: for (a, b) descending,
        ``a < A OR (a = A AND b < B)``."""
        names = [name.lstrip("-") for name in self.ordering]
        lookup = "lt" if self.ordering[0].startswith("-") else "gt"
        values = [self._decode_value(model._meta.get_field(n), raw) for n, raw in zip(names, encoded, strict=True)]
        condition = Q(**{f"{names[-1]}__{lookup}": values[-1]})
        for name, value in reversed(list(zip(names[:-1], values[:-1], strict=True))):
            condition = Q(**{f"{name}__{lookup}": value}) | (Q(**{name: value}) & condition)
        return condition

    @staticmethod
    def _decode_value(field, raw):
        if not isinstance(raw, str):
            raise ValidationError({"cursor": ["Invalid cursor."]})
        try:
            if isinstance(field, models.DateTimeField):
                return parse_rfc3339(raw)
            if isinstance(field, models.IntegerField):
                if not raw.isascii() or not raw.lstrip("-").isdigit() or len(raw) > 20:
                    raise ValueError
                return int(raw)
            if len(raw) > field.max_length or "\x00" in raw:
                raise ValueError
            return raw
        except ValueError:
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None

    def _position(self, instance) -> str:
        values = []
        for name in self.ordering:
            value = getattr(instance, name.lstrip("-"))
            values.append(format_utc(value) if isinstance(value, datetime) else str(value))
        return json.dumps(values, separators=(",", ":"))

    # --- response side ----------------------------------------------------------------

    def next_cursor(self) -> str | None:
        if not self.has_next:
            return None
        return self.encode_cursor(Cursor(offset=0, reverse=False, position=self._position(self.page[-1])))


# A request without query parameters: the first page at the default limit.
_FIRST_PAGE = SimpleNamespace(query_params=QueryDict())


def keyset_page(queryset, serializer_class, *, ordering: tuple[str, ...], request=None) -> dict:
    """``{"items", "next_cursor"}``: the page of ``queryset`` in ``ordering`` that the
    request's ``cursor`` and ``limit`` select (the first page without a request),
    rendered with ``serializer_class``."""
    paginator = KeysetCursorPagination(ordering=ordering)
    page = paginator.paginate_queryset(queryset, request if request is not None else _FIRST_PAGE)
    return {"items": serializer_class(page, many=True).data, "next_cursor": paginator.next_cursor()}


def paginated_response(request, queryset, serializer_class, *, ordering: tuple[str, ...]) -> Response:
    """One page of ``queryset`` in ``ordering``, rendered with ``serializer_class``."""
    return Response(keyset_page(queryset, serializer_class, ordering=ordering, request=request))
