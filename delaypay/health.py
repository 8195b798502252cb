"""Readiness checks behind GET /readyz: can this process serve, and is the engine moving?

Each check answers ``{"ok": bool, ...}`` with a short reason, never an exception text
(a connection error can carry a host name or a user; no credentials are ever shown).
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
    broker.redis_client().ping()
    return {"ok": True}


def check_promoter() -> dict:
    tick = heartbeat_readings().get(Heartbeat.PROMOTER)
    if tick is None:
        return {"ok": False, "error": "never_ticked"}
    limit = settings.DELAYPAY_READY_MAX_TICK_AGE_SECONDS
    return {"ok": tick.age_seconds <= limit, "last_tick_age_seconds": round(tick.age_seconds, 3),
            "max_age_seconds": limit}


def readiness() -> tuple[bool, dict]:
    """(ready, checks). Database, migrations and Redis always count; the promoter's
    heartbeat counts unless DELAYPAY_READY_REQUIRE_PROMOTER is off (it is still shown)."""
    checks = {"database": _timed(check_database)}
    if checks["database"]["ok"]:
        checks["migrations"] = _timed(check_migrations)
        checks["promoter"] = _timed(check_promoter)
    else:
        checks["migrations"] = {"ok": False, "error": "database_unavailable"}
        checks["promoter"] = {"ok": False, "error": "database_unavailable"}
    checks["redis"] = _timed(check_redis)
    required = ["database", "migrations", "redis"]
    if settings.DELAYPAY_READY_REQUIRE_PROMOTER:
        required.append("promoter")
    for name, check in checks.items():
        check["required"] = name in required
    return all(checks[name]["ok"] for name in required), checks
