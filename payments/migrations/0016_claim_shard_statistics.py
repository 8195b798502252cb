# Claim shards (DELAYPAY_CLAIM_SHARDS, sql.CLAIM_DUE_SHARD): statistics on the hash a
# shard's claim filters on, so the planner estimates a shard's share of the due rows
# (~1/K) and walks the due index in order; without them it guesses 0.5 % and sorts every
# due row per claim. No table rewrite and no index: ANALYZE (autovacuum's or the
# migration's own) fills them from its sample.

from django.db import migrations

HASH = "(hashtext(id) & 2147483647)"  # sql.SHARD_HASH, as it stands in the claim


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0015_sender_due_index"),
    ]

    operations = [
        migrations.RunSQL(
            f"CREATE STATISTICS payments_claim_shard_stats ON ({HASH}) FROM payments_scheduledpayment;"
            " ANALYZE payments_scheduledpayment;",
            "DROP STATISTICS payments_claim_shard_stats;",
        ),
    ]
