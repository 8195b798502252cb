"""The append-only refusal names the table written to, not the partition holding the row.

payments_paymentevent and payments_executionattempt refuse UPDATE and DELETE by a row
trigger since migration 0002 (payments_append_only()); 0018 partitioned both, and a
trigger on a partitioned table is cloned onto each partition, those made later included.
The function raised with TG_TABLE_NAME, which is then the partition's name
(``payments_paymentevent_p202612 is append-only``); it now names the partition tree's
root, and the partition in DETAIL. payments_recurringevent, not partitioned, reads as
before. Only the message changes: the triggers, and what they refuse, stay as they were.
tests/payments/test_models.py refuses an UPDATE and a DELETE of each table through raw
SQL (on the parent and on a partition) and through the ORM.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION payments_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused',
        COALESCE(pg_partition_root(TG_RELID), TG_RELID)::regclass, TG_OP
        USING ERRCODE = 'restrict_violation', DETAIL = format('The row is in %s.', TG_RELID::regclass);
END $$ LANGUAGE plpgsql;
"""

# Migration 0002's function.
BACKWARD = """
CREATE OR REPLACE FUNCTION payments_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0021_lookup_keys_off_the_hot_path"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
