"""Drop the varchar_pattern_ops ("_like") copies Django adds to the text primary key of
accounts and the unique transfer key: they serve LIKE 'prefix%' queries, which the
ledger never runs, and cost every transfer insert and every balance update that is not
HOT. Measured with `manage.py bench burst` (README "Benchmarks")."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("ledger", "0003_staff_permissions")]

    operations = [
        migrations.RunSQL(
            [
                "DROP INDEX IF EXISTS ledger_transfer_key_451b4b01_like",
                "DROP INDEX IF EXISTS ledger_account_id_e2af4b79_like",
            ],
            [
                "CREATE INDEX IF NOT EXISTS ledger_transfer_key_451b4b01_like"
                " ON ledger_transfer (key varchar_pattern_ops)",
                "CREATE INDEX IF NOT EXISTS ledger_account_id_e2af4b79_like ON ledger_account (id varchar_pattern_ops)",
            ],
        ),
    ]
