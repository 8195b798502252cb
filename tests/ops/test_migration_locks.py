"""`migrate` waits at most DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS for any lock, then fails,
rather than queue the money path behind itself (docs/reference/migrations.md); and the
session it ran on is back to no limit afterwards."""

import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.sql import emit_post_migrate_signal, emit_pre_migrate_signal
from django.db import OperationalError, connection

from tests.concurrency import other_session


def lock_timeout() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW lock_timeout")
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_migration_statement_behind_a_held_lock_fails_after_the_timeout_and_the_session_is_reset_after(settings):
    settings.DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS = 0.5
    with other_session() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE ledger_account IN ACCESS EXCLUSIVE MODE")  # a long transaction on the table
        emit_pre_migrate_signal(verbosity=0, interactive=False, db="default")  # what `migrate` sends first
        assert lock_timeout() == "500ms"
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"), connection.cursor() as cur:
            cur.execute("ALTER TABLE ledger_account ADD COLUMN never_added integer")
        assert time.monotonic() - started < 5
        holder.execute("ROLLBACK")
    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")  # what `migrate` sends last
    assert lock_timeout() == "0"


@pytest.mark.django_db(transaction=True)
def test_migrate_runs_under_the_setting_and_leaves_its_session_without_a_limit(settings):
    seen = []

    def record(sender, using, **kwargs):
        seen.append(lock_timeout())

    from django.db.models.signals import pre_migrate

    pre_migrate.connect(record, weak=False, dispatch_uid="test-record")  # after ledger's receiver
    try:
        call_command("migrate", verbosity=0)
    finally:
        pre_migrate.disconnect(dispatch_uid="test-record")
    assert seen and set(seen) == {"5s"}
    assert lock_timeout() == "0"


def test_the_default_is_five_seconds():
    assert settings.DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS == 5.0
