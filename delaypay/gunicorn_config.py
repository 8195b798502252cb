"""Gunicorn's settings for the web process (Procfile: ``gunicorn delaypay.wsgi -c
delaypay/gunicorn_config.py``); GUNICORN_CMD_ARGS and the command line's flags (bind,
workers) win over them. Loaded by path, so the master imports neither the delaypay
package (and its Celery app) nor Django.

Gunicorn refuses a request it cannot parse (an over-long request line, a header too
large, a control character in a header, a bad chunk) before Django sees it, with an HTML
page of its own. Here those answers are JSON in the API's one error shape, ``{"code",
"detail"}`` with a stable code per status (docs/reference/api.md, "Errors"). Gunicorn
decides the status and logs the request as before; only the page it writes changes.
"""

import json

from gunicorn import util

# Gunicorn's defaults, written out because the error details and the docs quote them.
limit_request_line = 4094  # bytes of "METHOD /path?query HTTP/1.1"; longer: 414
limit_request_fields = 100  # header fields; more: 431
limit_request_field_size = 8190  # bytes of one header field; larger: 431
# Gunicorn 25+ opens a control socket at one path per user ($XDG_RUNTIME_DIR or ~/.gunicorn):
# two web processes on one machine (make run beside the tests, two deploys) would share it.
# Nothing of ours uses gunicornc; the platform manages the process.
control_socket_disable = True


# Every status gunicorn answers by itself (gunicorn/workers/base.py, handle_error): the
# code and detail of each, for the limits in force (GUNICORN_CMD_ARGS and flags may change them).
def server_errors(cfg) -> dict[int, tuple[str, str]]:
    return {
        400: (
            "bad_request",
            "The server could not parse the request: its request line, a header or the chunked body is malformed.",
        ),
        403: ("permission_denied", "The server refused the connection's request."),
        414: ("uri_too_long", f"The request line is longer than {cfg.limit_request_line} bytes."),
        417: ("expectation_failed", "The only Expect the server supports is 100-continue."),
        431: (
            "header_too_large",
            f"A header field is larger than {cfg.limit_request_field_size} bytes, "
            f"or there are more than {cfg.limit_request_fields} of them.",
        ),
        500: ("server_error", "Internal server error."),
        501: ("not_implemented", "The Transfer-Encoding is not supported: send chunked or a Content-Length."),
    }


def error_response(status_int: int, reason: str, errors: dict[int, tuple[str, str]]) -> bytes:
    """The whole answer: status line, headers and a JSON body (ASCII: json.dumps escapes)."""
    fallback = ("bad_request", "Bad request.") if status_int < 500 else ("server_error", "Internal server error.")
    code, detail = errors.get(status_int, fallback)
    body = json.dumps({"code": code, "detail": detail}, separators=(",", ":")).encode("ascii")
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        "X-Content-Type-Options: nosniff\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("latin-1") + body


def json_error_writer(cfg):
    """A stand-in for gunicorn.util.write_error(sock, status_int, reason, mesg) that writes
    JSON. ``mesg`` (which may quote the offending bytes) is not echoed: gunicorn has
    already logged it."""
    errors = server_errors(cfg)

    def write_error(sock, status_int, reason, mesg):
        util.write_nonblock(sock, error_response(status_int, reason, errors))

    return write_error


def post_fork(server, worker):
    # Gunicorn's workers write these answers through util.write_error and nothing else.
    util.write_error = json_error_writer(worker.cfg)
