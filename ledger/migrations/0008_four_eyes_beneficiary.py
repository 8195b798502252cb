"""Four eyes that cannot be gone around (issue 33): nobody approves money into an account
they own, and no staff act on money or an account is done by its owner.

* ``ledger_depositrequest.beneficiary``: the account's owner, set by a trigger from the
  account at insert (whatever the writer said), and a CHECK that an approved request was
  not decided by it. ``why`` says why the deposit waits for a second person.
* ``ledger_depositrequest_guard`` (0005's) also freezes the two new columns.
* ``ledger_staffaction_not_for_self``: a deposit, an approval, a freeze or an unfreeze
  recorded with the account's owner as its actor is refused, so a path that forgot the
  service's rule still cannot commit it (every such act records its staff action in its
  own transaction).
* The rolling sums of approver-less deposits read a partial index by actor.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

BACKFILL = """
ALTER TABLE ledger_depositrequest DISABLE TRIGGER ledger_depositrequest_guard;
UPDATE ledger_depositrequest r SET beneficiary_id = a.owner_id FROM ledger_account a WHERE a.id = r.account_id;
ALTER TABLE ledger_depositrequest ENABLE TRIGGER ledger_depositrequest_guard;
"""

GUARD = """
CREATE OR REPLACE FUNCTION ledger_depositrequest_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'ledger_depositrequest rows are never deleted' USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status <> 'pending' OR NEW.status = 'pending'
       OR NEW.id <> OLD.id OR NEW.account_id <> OLD.account_id OR NEW.amount <> OLD.amount
       OR NEW.reason <> OLD.reason OR NEW.requested_by_id <> OLD.requested_by_id
       OR NEW.created_at <> OLD.created_at
       OR NEW.beneficiary_id IS DISTINCT FROM OLD.beneficiary_id OR NEW.why <> OLD.why THEN
        RAISE EXCEPTION 'deposit request %: % -> % refused', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION ledger_depositrequest_beneficiary() RETURNS trigger AS $$
BEGIN
    NEW.beneficiary_id := (SELECT owner_id FROM ledger_account WHERE id = NEW.account_id);
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_depositrequest_beneficiary
    BEFORE INSERT ON ledger_depositrequest
    FOR EACH ROW EXECUTE FUNCTION ledger_depositrequest_beneficiary();

CREATE OR REPLACE FUNCTION ledger_staffaction_not_for_self() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_account WHERE id = NEW.account_id AND owner_id = NEW.actor_id) THEN
        RAISE EXCEPTION 'staff action % by user % on account % refused: the actor owns the account',
            NEW.action, NEW.actor_id, NEW.account_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_staffaction_not_for_self
    BEFORE INSERT ON ledger_staffaction
    FOR EACH ROW WHEN (NEW.action IN ('deposit', 'deposit_approved', 'freeze', 'unfreeze'))
    EXECUTE FUNCTION ledger_staffaction_not_for_self();
"""

# 0005's guard, as it was.
UNDO_GUARD = """
DROP TRIGGER IF EXISTS ledger_staffaction_not_for_self ON ledger_staffaction;
DROP FUNCTION IF EXISTS ledger_staffaction_not_for_self();
DROP TRIGGER IF EXISTS ledger_depositrequest_beneficiary ON ledger_depositrequest;
DROP FUNCTION IF EXISTS ledger_depositrequest_beneficiary();
CREATE OR REPLACE FUNCTION ledger_depositrequest_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'ledger_depositrequest rows are never deleted' USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status <> 'pending' OR NEW.status = 'pending'
       OR NEW.id <> OLD.id OR NEW.account_id <> OLD.account_id OR NEW.amount <> OLD.amount
       OR NEW.reason <> OLD.reason OR NEW.requested_by_id <> OLD.requested_by_id
       OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'deposit request %: % -> % refused', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0007_transfers_without_foreign_keys"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="depositrequest",
            name="beneficiary",
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="depositrequest",
            name="beneficiary",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="+", to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name="depositrequest",
            name="why",
            field=models.CharField(
                choices=[
                    ("above_threshold", "above the approval threshold"),
                    ("own_account", "into an account the requester owns"),
                    ("actor_window", "the requester's deposits in the window would pass the threshold"),
                    ("beneficiary_window", "the beneficiary's deposits in the window would pass the threshold"),
                ],
                default="above_threshold",
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="depositrequest",
            constraint=models.CheckConstraint(
                condition=models.Q(models.Q(("status", "approved"), _negated=True),
                                   models.Q(("decided_by", models.F("beneficiary")), _negated=True), _connector="OR"),
                name="ledger_depositrequest_not_approved_by_beneficiary",
            ),
        ),
        migrations.AddConstraint(
            model_name="depositrequest",
            constraint=models.CheckConstraint(
                condition=models.Q(("why__in", ["above_threshold", "own_account", "actor_window",
                                                "beneficiary_window"])),
                name="ledger_depositrequest_why_valid",
            ),
        ),
        migrations.AddIndex(
            model_name="staffaction",
            index=models.Index(condition=models.Q(("action", "deposit")), fields=["actor", "created_at"],
                               name="ledger_staffaction_deposit_idx"),
        ),
        migrations.RunSQL(GUARD, UNDO_GUARD),
    ]
