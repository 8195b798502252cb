"""The served OpenAPI schema's postprocessing that belongs to the project, not to an app:
the answers the HTTP server gives before any view runs.

Gunicorn (delaypay/gunicorn_config.py) refuses a request line over ``limit_request_line``
bytes with 414 uri_too_long, and a header over ``limit_request_field_size`` bytes (or too
many headers) with 431 header_too_large, in the API's error shape, on every path. Any
operation can meet both with a well-formed request, so both are documented on every
operation. The server's other refusals (400 bad_request for a malformed request line,
header or chunk, 417 for an Expect it does not support, 501 for a Transfer-Encoding other
than chunked) answer requests that are not well-formed HTTP; the schema's description names
them once.
"""

from types import SimpleNamespace

from delaypay import gunicorn_config

# The statuses documented on every operation, with the limits gunicorn_config sets.
EVERY_OPERATION = (414, 431)
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def server_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: 414 and 431 on every operation, in the Error shape."""
    limits = SimpleNamespace(
        limit_request_line=gunicorn_config.limit_request_line,
        limit_request_fields=gunicorn_config.limit_request_fields,
        limit_request_field_size=gunicorn_config.limit_request_field_size,
    )
    errors = gunicorn_config.server_errors(limits)
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            for status in EVERY_OPERATION:
                code, detail = errors[status]
                operation["responses"].setdefault(
                    str(status),
                    {
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                        "description": f"{code}: from the HTTP server, before any view. {detail}",
                    },
                )
            operation["responses"] = dict(sorted(operation["responses"].items()))
    return result
