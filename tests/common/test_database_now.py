"""common.db.database_now: the transaction's now() by default, the moving clock on request."""

import time

import pytest
from django.db import connection, transaction

from common.db import database_now


@pytest.mark.django_db(transaction=True)
def test_now_is_the_transactions_start_and_the_clock_moves_on():
    with transaction.atomic():
        first = database_now()
        time.sleep(0.02)
        with connection.cursor() as cur:
            assert database_now(cur) == first  # the same transaction, the same now()
            assert database_now(cur, clock=True) > first
        assert database_now(clock=True) > first
    assert first.utcoffset().total_seconds() == 0
