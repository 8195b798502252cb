"""Transfers are append-only (a trigger, so not even a bug or the admin can rewrite
history), and the one system issuance account through which money enters."""

from django.db import migrations

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_transfer_append_only
    BEFORE UPDATE OR DELETE ON ledger_transfer
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
"""

DROP_APPEND_ONLY = """
DROP TRIGGER IF EXISTS ledger_transfer_append_only ON ledger_transfer;
DROP FUNCTION IF EXISTS ledger_append_only();
"""


def create_issuance(apps, schema_editor):
    Account = apps.get_model("ledger", "Account")
    Account.objects.get_or_create(
        id="acc_issuance", defaults={"name": "Issuance", "kind": "system", "status": "active", "balance": 0}
    )


def drop_issuance(apps, schema_editor):
    apps.get_model("ledger", "Account").objects.filter(id="acc_issuance").delete()


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [
        migrations.RunSQL(APPEND_ONLY, DROP_APPEND_ONLY),
        migrations.RunPython(create_issuance, drop_issuance),
    ]
