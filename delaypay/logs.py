"""Structured logs: one JSON object per line in production, key=value text in development.

Every process (web, promoter, workers) logs through the root logger configured in
settings.LOGGING. Structured fields travel as ``extra={...}``; the request id of the
HTTP request being served is added to every line logged while serving it. Fields whose
name looks like a credential are replaced by ``"[redacted]"``; request bodies are never
logged.
"""

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_SECRET_KEY_RE = re.compile(r"pass(word)?|secret|token|authorization|api_?key|cookie|session|credential", re.I)
REDACTED = "[redacted]"
# What a client may send as X-Request-ID: short, no spaces or control characters.
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def redact(fields: dict) -> dict:
    return {k: (REDACTED if _SECRET_KEY_RE.search(k) else v) for k, v in fields.items()}


def extra_fields(record: logging.LogRecord) -> dict:
    """The structured fields of a record (its ``extra``), redacted, plus the request id."""
    fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS and not k.startswith("_")}
    if record.name.startswith("celery") and isinstance(fields.get("data"), dict):
        # Celery passes its whole context (task arguments: a batch of up to 500 pairs,
        # exception objects) as "data"; the task's id and name are what a line needs.
        data = fields.pop("data")
        fields.update({"task_id": data.get("id"), "task_name": data.get("name")})
    request = fields.get("request")
    if hasattr(request, "method") and hasattr(request, "path"):
        # django.request passes the request itself; its repr carries the query string.
        fields["request"] = f"{request.method} {request.path}"
    request_id = request_id_var.get()
    if request_id and "request_id" not in fields:
        fields["request_id"] = request_id
    return redact(fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, process, message, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "pid": record.process,
            "message": record.getMessage(),
            **extra_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """Human-readable, for development: the classic line followed by key=value fields."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s %(processName)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = extra_fields(record)
        if fields:
            head, sep, tail = line.partition("\n")  # keep a traceback below the fields
            line = head + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + sep + tail
        return line


class ClientErrorWithoutTraceback(logging.Filter):
    """django.request logs a refused request (403 PermissionDenied, 400 ...) at WARNING
    with the exception's traceback: a page of stack per refused click, for an outcome
    that is no bug. A 4xx stays one line (its status and path); 5xx keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info = None
            record.exc_text = None
        return True


# Beat sends these every second (settings.CELERY_BEAT_SCHEDULE); a tick that did
# something logs its own line (payments/promoter.py "promoter tick", the webhook
# dispatcher per delivery).
TICK_TASKS = frozenset({"payments.tasks.promoter_tick", "webhooks.tasks.dispatch"})


def _tick_task_name(record: logging.LogRecord) -> str:
    data = getattr(record, "data", None)  # celery.app.trace and celery.worker.strategy
    if isinstance(data, dict):
        return str(data.get("name", ""))
    if record.name == "celery.beat" and isinstance(record.args, tuple) and len(record.args) == 2:
        return str(record.args[1])  # "Scheduler: Sending due task %s (%s)", entry name and task
    return ""


class TickLinesAtDebug(logging.Filter):
    """Celery's INFO lines for the per-second ticks (beat's "Sending due task", the
    worker's "Task ... received" and "... succeeded") become DEBUG: six lines a second
    that bury the workers' lines about payments. Other tasks' lines, and any tick line
    above INFO (a failure), are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or _tick_task_name(record) not in TICK_TASKS:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def logging_config(*, level: str, fmt: str) -> dict:
    """settings.LOGGING for ``fmt`` "json" or "text"."""
    if fmt not in ("json", "text"):
        raise ValueError(f'DELAYPAY_LOG_FORMAT must be "json" or "text", not {fmt!r}')
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": "delaypay.logs.JsonFormatter"},
            "text": {"()": "delaypay.logs.TextFormatter"},
        },
        "filters": {
            "client_errors": {"()": "delaypay.logs.ClientErrorWithoutTraceback"},
            "ticks": {"()": "delaypay.logs.TickLinesAtDebug"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": fmt}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Django's default logging (applied before this) gives "django" its own console
            # handler in DEBUG: every django.* line, a 403's traceback included, was written
            # twice, once by it and once by ours through the root. Only ours now.
            "django": {"handlers": [], "propagate": True},
            "django.db.backends": {"level": "INFO"},
            # A refused request is one line, not a traceback (ClientErrorWithoutTraceback).
            "django.request": {"filters": ["client_errors"]},
            "celery": {"level": level},
            # The per-second ticks' lines at DEBUG (TickLinesAtDebug).
            "celery.beat": {"filters": ["ticks"]},
            "celery.app.trace": {"filters": ["ticks"]},
            "celery.worker.strategy": {"filters": ["ticks"]},
            # httpx (webhook delivery) logs every request with its full URL at INFO: a
            # receiver's URL may carry a token of its owner's. webhooks/dispatcher.py logs
            # what a delivery did, by ids, itself.
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }


def request_id_from(header: str | None) -> str:
    """The client's X-Request-ID when it is well formed, else a new one."""
    if header and _REQUEST_ID_RE.match(header):
        return header
    return uuid.uuid4().hex


request_logger = logging.getLogger("delaypay.request")

# Scrapes and probes arrive every few seconds, the favicon with every page: logged at
# DEBUG, not INFO.
_QUIET_PATHS = frozenset({"/metrics", "/healthz", "/readyz", "/favicon.ico"})


class RequestLogMiddleware:
    """Give every request an id (X-Request-ID in, or generated; echoed back), and log one
    line per request with method, path (no query string, no body), status and timing."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request_id_from(request.headers.get("X-Request-ID"))
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = request_id
            fields = {
                "request_id": request_id,
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            }
            match = getattr(request, "resolver_match", None)
            if match is not None:
                fields["view"] = match.view_name
                for name in ("payment_id", "recurring_id"):
                    if name in match.kwargs:
                        fields[name] = match.kwargs[name]
            user = getattr(request, "user", None)
            if user is not None and getattr(user, "is_authenticated", False):
                fields["user_id"] = user.pk
            level = logging.DEBUG if request.path in _QUIET_PATHS else logging.INFO
            request_logger.log(level, "request", extra=fields)
            return response
        finally:
            request_id_var.reset(token)
