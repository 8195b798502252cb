"""The outbox triggers' join is a nested loop of primary-key lookups, whatever the
planner's estimates: each function runs with hash and merge joins and sequential scans
off (``ALTER FUNCTION ... SET``), and joins its transition table to the payment (or
series) rows on the key alone, as before migration 0004.

A PL/pgSQL statement's plan is made at its first run in a session and again after each
invalidation, with the transition table of that run. Migration 0004's form (the ids as an
``ANY`` array) was planned, after an empty firing (the claim's audit insert, which fires
the statement trigger with no rows), as a nested loop whose inner index scan took the
whole array again for every event: O(batch squared) a batch, 197 instead of 105 us of
the database's CPU a payment in ``bench_executor``, where claim and executor share a
session (as the promoter's degraded mode does). Migration 0003's form was planned, after
a firing of 1,000 events on a table that looked small, as a hash of the whole schedule
(0004's reason). With the join methods pinned, the only plan is one primary-key lookup
per event, at any batch and table size, and a partition that looked empty when the plan
was made is still read by its index. tests/webhooks/test_outbox.py reads the plans
(``auto_explain``) after both kinds of first firing.
"""

import importlib

from django.db import migrations

# Migration 0003's payment function and 0002's series function, the plain joins, each run
# with the three settings.
PINNED = "$$ LANGUAGE plpgsql\nSET enable_hashjoin = off SET enable_mergejoin = off SET enable_seqscan = off;"
_0003 = importlib.import_module("webhooks.migrations.0003_terminal_events_read_the_frozen_row")
_0004 = importlib.import_module("webhooks.migrations.0004_outbox_finds_rows_by_primary_key")
PAYMENT_OUTBOX = _0003.PAYMENT_OUTBOX.replace("$$ LANGUAGE plpgsql;", PINNED)
RECURRING_OUTBOX = _0004.RECURRING_OUTBOX_0002.replace("$$ LANGUAGE plpgsql;", PINNED)



class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0004_outbox_finds_rows_by_primary_key"),
    ]

    operations = [
        # The way back: 0004's functions (a function replaced without SET clauses has none).
        migrations.RunSQL(PAYMENT_OUTBOX + RECURRING_OUTBOX, _0004.PAYMENT_OUTBOX + _0004.RECURRING_OUTBOX),
    ]
