# The executor's start markers (sql.MARK_STARTED, models.StartMarker,
# docs/decisions/0008-start-markers-off-the-row.md): one narrow row per (payment, attempt) a
# worker started, instead of a new version of the payment row (a new tuple and an entry in
# five of its indexes, the third write of every payment). The count moves into the
# payment's ``tries`` when the attempt ends (the CAS) or its lease expires (the claim); a
# beat task deletes markers no attempt needs.
#
# UNLOGGED: no WAL. A PostgreSQL crash empties the table, losing the tries of the attempts
# in flight at that moment, as the asynchronous commit of the old marker could: the
# budget counts workers dying on a payment, and a database crash is not that. Never read
# on a replica. No foreign key: a marker is looked up by its payment, never the reverse,
# and a marker of a payment gone is garbage the purge takes.

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0016_claim_shard_statistics"),
    ]

    operations = [
        migrations.CreateModel(
            name="StartMarker",
            fields=[
                ("pk", models.CompositePrimaryKey("payment_id", "attempt", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("payment_id", models.CharField(max_length=40)),
                ("attempt", models.IntegerField()),
                ("started_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.RunSQL(
            "ALTER TABLE payments_startmarker SET UNLOGGED",
            "ALTER TABLE payments_startmarker SET LOGGED",
        ),
    ]
