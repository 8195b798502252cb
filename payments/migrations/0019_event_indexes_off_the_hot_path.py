"""Two of the four indexes of the event log leave the hot path (every payment writes two
events; docs/explanation/performance.md):

* ``actor_user_id``: the B-tree Django gives a foreign key held an entry for every event,
  NULL for all but staff actions. It becomes ``payments_event_actor_idx``, partial on
  ``actor_user_id IS NOT NULL`` (it still serves the foreign key's checks and staff
  lookups). Only the index changes: the constraint is kept as it is (the field's
  ``db_index`` alone would make Django drop and re-validate it, a scan of the whole log
  under a lock).
* ``created_at``: the dashboard reads a window at the end of an append-only log; a BRIN
  index (``payments_event_created_brin``, summarized as ranges fill) finds it, where the
  B-tree took an entry per event.

Each CREATE INDEX reads the event log once, holding off its writes while it builds (a
partitioned index cannot be built CONCURRENTLY): seconds per million events.
"""

import django.contrib.postgres.indexes
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0018_partition_the_schedule"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="paymentevent",
            name="payments_event_created_idx",
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="paymentevent",
                    name="actor_user",
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                            to=settings.AUTH_USER_MODEL),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS payments_paymentevent_actor_user_id_43fd5964",
                    "CREATE INDEX payments_paymentevent_actor_user_id_43fd5964 ON payments_paymentevent (actor_user_id)",
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="paymentevent",
            index=models.Index(condition=models.Q(("actor_user__isnull", False)), fields=["actor_user"],
                               name="payments_event_actor_idx"),
        ),
        migrations.AddIndex(
            model_name="paymentevent",
            index=django.contrib.postgres.indexes.BrinIndex(autosummarize=True, fields=["created_at"],
                                                             name="payments_event_created_brin"),
        ),
    ]
