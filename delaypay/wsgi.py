"""The WSGI application (``gunicorn delaypay.wsgi``): Django, with chunked request bodies
made readable.

A body sent with ``Transfer-Encoding: chunked`` has no Content-Length, and Django reads
exactly Content-Length bytes: it would see an empty body (a valid payment sent chunked
got 400 "field required"). Gunicorn de-chunks the body and says so with
``wsgi.input_terminated``; here such a body is read up to its limit, handed on with its
Content-Length, and refused with 413 ``payload_too_large`` (the API's error shape) when
it is longer. The limit is the API's body limit (DELAYPAY_MAX_BODY_BYTES) under /api/
and Django's DATA_UPLOAD_MAX_MEMORY_SIZE elsewhere. Gunicorn also frames ``gzip,
chunked`` but does not decompress: any coding besides chunked is 501 ``not_implemented``,
as gunicorn answers the codings it does not know.
"""

import io
import json
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "delaypay.settings")

django_application = get_wsgi_application()

from django.conf import settings  # noqa: E402  (configured by get_wsgi_application)

from common import db_deadline, db_failover  # noqa: E402

# A frozen primary must not hold a web thread for ever (common/db_deadline.py); failovers
# and reconnects are counted (common/db_failover.py).
db_deadline.install()
db_failover.install()


def body_limit(environ) -> int:
    if environ.get("PATH_INFO", "").startswith("/api/"):
        return settings.DELAYPAY_MAX_BODY_BYTES
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE or settings.DELAYPAY_MAX_BODY_BYTES


def has_unsized_body(environ) -> bool:
    """A body the server de-chunked: Transfer-Encoding and no Content-Length. Only when
    the server promises the input ends where the body does (``wsgi.input_terminated``)
    may it be read to its end."""
    return (
        bool(environ.get("wsgi.input_terminated"))
        and "HTTP_TRANSFER_ENCODING" in environ
        and not environ.get("CONTENT_LENGTH")
    )


def error(start_response, status: str, code: str, detail: str):
    """An answer in the API's error shape, given before Django sees the request."""
    body = json.dumps({"code": code, "detail": detail}, separators=(",", ":")).encode()
    start_response(
        status,
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("X-Content-Type-Options", "nosniff"),
        ],
    )
    return [body]


def application(environ, start_response):
    if has_unsized_body(environ):
        codings = [c.strip(" \t").lower() for c in environ["HTTP_TRANSFER_ENCODING"].split(",")]
        if codings != ["chunked"]:
            return error(start_response, "501 Not Implemented", "not_implemented",
                         "The Transfer-Encoding is not supported: send chunked or a Content-Length.")
        limit = body_limit(environ)
        body = environ["wsgi.input"].read(limit + 1)
        if len(body) > limit:
            return error(start_response, "413 Request Entity Too Large", "payload_too_large",
                         f"The request body is larger than {limit} bytes.")
        environ["CONTENT_LENGTH"] = str(len(body))
        environ["wsgi.input"] = io.BytesIO(body)
    return django_application(environ, start_response)
