"""Readiness checks behind GET /readyz: can this process serve, and is the engine moving?

Each check answers ``{"ok": bool, ...}`` with a short reason, never an exception text
(a connection error can carry a host name or a user; no credentials are ever shown).

Redis is reported, never required: accepting and reading payments needs PostgreSQL
only, and while Redis is down the promoter executes from the database (degraded mode,
payments/fallback.py). /readyz then answers 200 with the status "degraded".
"""

import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from common import broker
from payments.models import Heartbeat
from payments.selectors import heartbeat_readings

_migrations_applied = False  # once true for this code, it stays true


def _timed(check: Callable[[], dict]) -> dict:
    started = time.perf_counter()
    try:
        result = check()
    except Exception as exc:
        result = {"ok": False, "error": type(exc).__name__}
    result["ms"] = round((time.perf_counter() - started) * 1000, 1)
    return result


def check_database() -> dict:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        cur.fetchone()
    return {"ok": True}


def check_migrations() -> dict:
    global _migrations_applied
    if not _migrations_applied:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if pending:
            return {"ok": False, "pending": len(pending)}
        _migrations_applied = True
    return {"ok": True}


def check_redis() -> dict:
    try:
        broker.probe_client().ping()  # one try, short timeouts
    except Exception as exc:
        return {"ok": False, "degraded": True, "error": type(exc).__name__}
    return {"ok": True, "degraded": False}


def check_promoter() -> dict:
    tick = heartbeat_readings().get(Heartbeat.PROMOTER)
    if tick is None:
        return {"ok": False, "error": "never_ticked"}
    limit = settings.DELAYPAY_READY_MAX_TICK_AGE_SECONDS
    return {"ok": tick.age_seconds <= limit, "last_tick_age_seconds": round(tick.age_seconds, 3),
            "max_age_seconds": limit}


def readiness() -> tuple[bool, dict]:
    """(ready, checks). Database and migrations always count; the promoter's heartbeat
    counts unless DELAYPAY_READY_REQUIRE_PROMOTER is off (it is still shown); Redis is
    shown and never counts (degraded mode)."""
    checks = {"database": _timed(check_database)}
    if checks["database"]["ok"]:
        checks["migrations"] = _timed(check_migrations)
        checks["promoter"] = _timed(check_promoter)
    else:
        checks["migrations"] = {"ok": False, "error": "database_unavailable"}
        checks["promoter"] = {"ok": False, "error": "database_unavailable"}
    checks["redis"] = _timed(check_redis)
    required = ["database", "migrations"]
    if settings.DELAYPAY_READY_REQUIRE_PROMOTER:
        required.append("promoter")
    for name, check in checks.items():
        check["required"] = name in required
    return all(checks[name]["ok"] for name in required), checks


def overall_status(ready: bool, checks: dict) -> str:
    """/readyz's status: "ok", "degraded" (ready, but Redis does not answer) or "unavailable"."""
    if not ready:
        return "unavailable"
    return "ok" if checks["redis"]["ok"] else "degraded"
