"""The outbox triggers find the payment (or series) rows of their events by primary key,
always: ``WHERE p.id = ANY(ARRAY(SELECT ... FROM new_events)) AND p.id = e.payment_id``,
as the claim and the executor's fence do (docs/decisions/0005-fence-by-primary-key.md).

Joined to the transition table alone, the planner priced a probe of each partition's
primary key per event above a sequential scan of the whole table and hashed it: every
executor batch read every payment ever scheduled, to copy the 1,000 it had just
finished (``auto_explain`` of ``bench_executor``: 47 of the statement's 59 ms a batch at
40,000 rows, a fifth of the database's CPU; O(table) per batch, so the larger the
history, the slower every batch, until the planner switched plans). A plpgsql trigger's
plan is also made once per session and kept, whatever the table grows to. With the ids
as an array, the index scan of the events' own rows is the plan at every table size
(tests/webhooks/test_outbox.py, under statistics of a small table).

Nothing else changes: the same rows, the same snapshots.
"""

import importlib

from django.db import migrations

# The functions before (migration 0003's for payments, 0002's for series), each given its
# ids as an array; the way back is the function before.
_0002 = importlib.import_module("webhooks.migrations.0002_outbox_triggers")
_0003 = importlib.import_module("webhooks.migrations.0003_terminal_events_read_the_frozen_row")
PAYMENT_OUTBOX_0003 = _0003.PAYMENT_OUTBOX
_END = "$$ LANGUAGE plpgsql;"
_RECURRING = _0002.TRIGGERS[_0002.TRIGGERS.index("CREATE FUNCTION webhooks_recurring_outbox"):]
_RECURRING = _RECURRING[:_RECURRING.index(_END) + len(_END)]
RECURRING_OUTBOX_0002 = "\n" + _RECURRING.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION") + "\n"

PAYMENT_BY_KEY = """
       AND p.id = ANY(ARRAY(SELECT payment_id FROM new_events
                             WHERE kind IN ('executed', 'failed', 'cancelled', 'parked', 'updated')))"""
RECURRING_BY_KEY = """
       AND r.id = ANY(ARRAY(SELECT recurring_id FROM new_events WHERE kind IN ('paused', 'resumed', 'ended')))"""
PAYMENT_OUTBOX = PAYMENT_OUTBOX_0003.replace("\n     ORDER BY e.id;", PAYMENT_BY_KEY + "\n     ORDER BY e.id;")
RECURRING_OUTBOX = RECURRING_OUTBOX_0002.replace("\n     ORDER BY e.id;", RECURRING_BY_KEY + "\n     ORDER BY e.id;")


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0003_terminal_events_read_the_frozen_row"),
    ]

    operations = [
        migrations.RunSQL(PAYMENT_OUTBOX, PAYMENT_OUTBOX_0003),
        migrations.RunSQL(RECURRING_OUTBOX, RECURRING_OUTBOX_0002),
    ]
