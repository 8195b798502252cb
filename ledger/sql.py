"""Every raw SQL statement of the ledger, each under a name that says what it does.

Raw SQL because the batch forms are set-based (``unnest`` of arrays: one INSERT and one
UPDATE however many postings a batch has) and the account reads must say ``FOR NO KEY
UPDATE`` in id order (no key changes, so foreign-key checks of rows that reference an
account, which take ``FOR KEY SHARE``, never wait on a posting batch).
``ledger/services.py`` and ``ledger/selectors.py`` run them.
"""

# The accounts of a batch, read in ascending id order; %s: the ids. The locking form
# is what makes concurrent batches that share accounts wait instead of deadlocking.
# A join to the unnested ids, not ``id = ANY(%s)``: one primary-key probe per id whatever
# the plan. The statements are prepared (common.db.bound_cursor), and the generic plan of
# ``= ANY`` of a parameter is a bitmap scan whose recheck holds the whole array; with it
# the account lock took 2.5 times as long in a burst, waiting behind other batches
# (decision 0013; tests/payments/test_execution_plans.py reads the generic plan).
READ_ACCOUNTS = """
SELECT a.id, a.kind, a.status, a.balance
  FROM unnest(%s::text[]) AS i(id) JOIN ledger_account a ON a.id = i.id
 ORDER BY a.id
"""
LOCK_ACCOUNTS = READ_ACCOUNTS + "   FOR NO KEY UPDATE OF a\n"

# The transfers already recorded under some keys, with when they were posted; %s: keys.
TRANSFER_TIMES = "SELECT key, created_at FROM ledger_transfer WHERE key = ANY(%s)"

# A batch's new transfers in one statement; %s: keys, debit ids, credit ids, amounts.
INSERT_TRANSFERS = """
INSERT INTO ledger_transfer (key, debit_account_id, credit_account_id, amount, created_at)
SELECT k, d, c, a, now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS t(k, d, c, a)
"""

# A batch's balance changes, one row per account with its deltas summed; %s: account
# ids (ascending, as locked), deltas.
APPLY_BALANCE_DELTAS = """
UPDATE ledger_account a SET balance = a.balance + v.delta, updated_at = now()
  FROM unnest(%s::text[], %s::bigint[]) AS v(id, delta)
 WHERE a.id = v.id
"""

# Phase one of two-phase transfers: the pending rows of the reserves just posted;
# %s: keys, debit ids, clearing ids, credit ids, amounts. A key reserved before (a
# retry) keeps its row.
INSERT_PENDING = """
INSERT INTO ledger_pendingtransfer (key, debit_account_id, clearing_account_id, credit_account_id, amount, state,
                                    created_at)
SELECT k, d, c, s, a, 'pending', now()
  FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[]) AS t(k, d, c, s, a)
ON CONFLICT (key) DO NOTHING
"""

# Phase two: the compare-and-set pending -> posted or voided (%s: the new state, keys),
# returning what the posting needs. Rows locked in key order.
RESOLVE_PENDING = """
WITH todo AS (
    SELECT key FROM ledger_pendingtransfer WHERE key = ANY(%(keys)s::text[]) AND state = 'pending'
     ORDER BY key FOR NO KEY UPDATE
)
UPDATE ledger_pendingtransfer t
   SET state = %(state)s, resolved_at = now()
  FROM todo
 WHERE t.key = todo.key
RETURNING t.key, t.debit_account_id, t.clearing_account_id, t.credit_account_id, t.amount
"""

PENDING_STATES = "SELECT key, state FROM ledger_pendingtransfer WHERE key = ANY(%s::text[])"

# Four eyes: the deposits of one actor, and into one beneficiary's accounts, are decided
# one at a time (ledger/services.py, _deposit_governed), so the rolling sums each reads
# include every deposit committed before it. Held to the commit.
LOCK_DEPOSIT_GOVERNANCE = "SELECT pg_advisory_xact_lock(%(namespace)s::int4, %(user)s::int4)"
