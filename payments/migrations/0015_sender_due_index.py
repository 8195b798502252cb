# The fair claim's per-sender index (sql.CLAIM_DUE_FAIR, DELAYPAY_CLAIM_PER_SENDER): a hot
# sender's due internal payments, oldest first. Built CONCURRENTLY, as 0011: in
# production the table may hold millions of rows and stays live (no lock that blocks
# schedules or claims while it builds; a failed build leaves an INVALID index to drop
# and build again). The test database builds it the same way, on an empty table.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("payments", "0014_payouts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduledpayment",
            index=models.Index(
                condition=models.Q(("next_attempt_at__isnull", True), ("rail", ""), ("status", "SCHEDULED")),
                fields=["from_account", "execute_at", "id"],
                name="payments_sender_due_idx",
            ),
        ),
    ]
