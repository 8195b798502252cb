"""Idempotency keys with Stripe's semantics.

The key row is inserted in the same transaction as whatever the request creates and
updated with the rendered response before commit, so a key exists exactly when its
effect does. A concurrent twin blocks on the unique index until the first commits,
then replays its response; if the first rolls back, the twin proceeds as the first.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import OperationalError, connection, transaction

from common.db import delete_in_batches

from . import sql
from .exceptions import IdempotencyKeyInUse, IdempotencyKeyReused
from .models import IdempotencyKey

# Clients may replay a request this long after it; the purge never deletes younger keys.
KEY_RETENTION = timedelta(hours=24)
# How long a twin waits for the first request's transaction before answering 409.
KEY_LOCK_TIMEOUT = "5s"


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: str
    replayed: bool


def request_fingerprint(*, method: str, path: str, body) -> str:
    """SHA-256 of the method, path and canonical JSON body (sorted keys, no spaces)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method}\n{path}\n{canonical}".encode()).hexdigest()


def idempotent_call(
    *, actor, key: str, fingerprint: str, create: Callable[[], tuple[int, str]]
) -> StoredResponse:
    """Run ``create`` once per (actor, key); replay its stored response afterwards."""
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(sql.SET_LOCAL_LOCK_TIMEOUT, [KEY_LOCK_TIMEOUT])
                cur.execute(sql.IDEMPOTENCY_CLAIM_KEY, [actor.pk, key, fingerprint])
                inserted = cur.fetchone()
                cur.execute(sql.SET_LOCAL_LOCK_TIMEOUT, ["0"])
            if inserted is None:
                stored = IdempotencyKey.objects.get(actor=actor, key=key)
                if stored.fingerprint != fingerprint:
                    raise IdempotencyKeyReused()
                if stored.response_status is None:
                    raise IdempotencyKeyInUse()
                return StoredResponse(stored.response_status, stored.response_body, replayed=True)
            status, body = create()
            IdempotencyKey.objects.filter(pk=inserted[0]).update(response_status=status, response_body=body)
            return StoredResponse(status, body, replayed=False)
    except OperationalError as exc:
        # lock_timeout: the first request with this key is still running.
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":
            raise IdempotencyKeyInUse() from exc
        raise


def idempotency_keys_purge(*, older_than: timedelta = KEY_RETENTION, batch: int = 10_000) -> int:
    """Delete keys older than ``older_than`` (never less than 24 hours), judged on the
    database clock, ``batch`` rows per transaction so no lock is held for long.
    Returns the count."""
    older_than = max(older_than, KEY_RETENTION)
    return delete_in_batches(sql.IDEMPOTENCY_PURGE, [older_than, batch], batch=batch)
