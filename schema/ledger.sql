-- The ledger's functions and triggers as they stand after the last migration of
-- ledger/migrations/. The migrations keep frozen copies (what each one ran); this file is
-- the current text. A migration that creates, replaces or drops one of these changes this
-- file too: tests/ops/test_schema_sql.py compares every function and trigger here with
-- the database's after the migrations, both ways. No CHECK constraint is written in raw
-- SQL: the models' CheckConstraints (ledger/models.py) are all there is.

-- Transfers and staff actions are history: never updated, never deleted (0002, 0005).
CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_transfer_append_only
    BEFORE UPDATE OR DELETE ON ledger_transfer
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE TRIGGER ledger_staffaction_append_only
    BEFORE UPDATE OR DELETE ON ledger_staffaction
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

-- A deposit request is decided once, pending -> approved | rejected, and nothing else of
-- it changes; none is deleted (0005, 0008 added the beneficiary and why).
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

CREATE TRIGGER ledger_depositrequest_guard
    BEFORE UPDATE OR DELETE ON ledger_depositrequest
    FOR EACH ROW EXECUTE FUNCTION ledger_depositrequest_guard();

-- The beneficiary is the account's owner, whatever the writer said (0008).
CREATE OR REPLACE FUNCTION ledger_depositrequest_beneficiary() RETURNS trigger AS $$
BEGIN
    NEW.beneficiary_id := (SELECT owner_id FROM ledger_account WHERE id = NEW.account_id);
    RETURN NEW;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_depositrequest_beneficiary
    BEFORE INSERT ON ledger_depositrequest
    FOR EACH ROW EXECUTE FUNCTION ledger_depositrequest_beneficiary();

-- No staff act on money or an account by the account's owner (0008).
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

-- An account is closed, never deleted: transfers keep no foreign key to it (0007,
-- docs/decisions/0014-transfers-without-foreign-keys.md).
CREATE OR REPLACE FUNCTION ledger_account_never_deleted() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'account % is never deleted: close it instead', OLD.id
        USING ERRCODE = 'restrict_violation';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER ledger_account_never_deleted
    BEFORE DELETE ON ledger_account
    FOR EACH ROW EXECUTE FUNCTION ledger_account_never_deleted();
