# execute_at of every finished payment (SCHEDULED rows are in payments_due_idx,
# EXECUTING ones in payments_lease_idx): the admin's due-time views over every status
# read the three partial indexes (selectors.payment_execute_at_condition); neither of the
# claim's scans ("status = 'SCHEDULED'", "status = 'EXECUTING'") can be planned on this
# one. Built CONCURRENTLY: the table may be large and live.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("payments", "0010_drop_execute_at_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scheduledpayment",
            index=models.Index(
                condition=models.Q(("status__in", ["CANCELLED", "EXECUTED", "FAILED"])),
                fields=["execute_at"],
                name="payments_finished_idx",
            ),
        ),
    ]
