"""Transfers without foreign-key constraints to their accounts, and accounts that are
never deleted (decision 0014).

The two constraints were deferred: at the commit of every executor batch PostgreSQL ran
one query per transfer and account to find the account it had just locked (6.8 % of its
CPU in a burst). ``ledger_post_batch``, the one writer of transfers, reads and locks both
accounts in the transfer's transaction and refuses an unknown one; the trigger below
refuses to delete an account at all (an account is closed, never deleted), which is what
the constraints' ``NO ACTION`` guarded after the commit. Django's ``on_delete=PROTECT``
stays on the model for the ORM.
"""

import django.db.models.deletion
from django.db import migrations, models

NEVER_DELETED = """
CREATE OR REPLACE FUNCTION ledger_account_never_deleted() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'account % is never deleted: close it instead', OLD.id
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_account_never_deleted
    BEFORE DELETE ON ledger_account
    FOR EACH ROW EXECUTE FUNCTION ledger_account_never_deleted();
"""

DROP_NEVER_DELETED = """
DROP TRIGGER IF EXISTS ledger_account_never_deleted ON ledger_account;
DROP FUNCTION IF EXISTS ledger_account_never_deleted();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0006_pending_transfers"),
    ]

    operations = [
        migrations.RunSQL(NEVER_DELETED, DROP_NEVER_DELETED),
        migrations.AlterField(
            model_name="transfer",
            name="credit_account",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.PROTECT, related_name="credits",
                                    to="ledger.account"),
        ),
        migrations.AlterField(
            model_name="transfer",
            name="debit_account",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.PROTECT, related_name="debits",
                                    to="ledger.account"),
        ),
    ]
