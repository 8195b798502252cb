"""Payouts: payees, payouts to them through a rail, the rails' breaker and pacing state,
and each rail's clearing and settlement accounts (system accounts of the ledger)."""

import django.db.models.deletion
import django.db.models.functions.datetime
import payments.models
from django.conf import settings
from django.db import migrations, models


RAILS = ("sandbox",)


def create_rail_accounts(apps, schema_editor):
    Account = apps.get_model("ledger", "Account")
    RailState = apps.get_model("payments", "RailState")
    for rail in RAILS:
        for role in ("clearing", "settlement"):
            Account.objects.get_or_create(
                id=f"acc_{rail}_{role}",
                defaults={"name": f"{rail.title()} rail {role}", "kind": "system", "status": "active", "balance": 0},
            )
        RailState.objects.get_or_create(rail=rail)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0006_pending_transfers'),
        ('payments', '0013_recurring_history'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Payout',
            fields=[
                ('payment', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, primary_key=True, related_name='payout', serialize=False, to='payments.scheduledpayment')),
                ('rail', models.CharField(choices=[('sandbox', 'Sandbox')], max_length=20)),
                ('destination', models.CharField(max_length=64)),
                ('amount', models.BigIntegerField()),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('paid', 'Paid'), ('declined', 'Declined'), ('voided', 'Voided')], default='pending', max_length=10)),
                ('reference', models.CharField(blank=True, default='', max_length=100)),
                ('paid_at', models.DateTimeField(blank=True, null=True)),
                ('decline_code', models.CharField(blank=True, default='', max_length=60)),
                ('submissions', models.IntegerField(default=0)),
                ('lookups', models.IntegerField(default=0)),
                ('last_error', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
            ],
            options={
                'ordering': ['created_at'],
            },
        ),
        migrations.CreateModel(
            name='RailState',
            fields=[
                ('rail', models.CharField(choices=[('sandbox', 'Sandbox')], max_length=20, primary_key=True, serialize=False)),
                ('breaker', models.CharField(choices=[('closed', 'Closed'), ('open', 'Open'), ('half_open', 'Half Open')], default='closed', max_length=10)),
                ('forced', models.CharField(blank=True, default='', max_length=10)),
                ('forced_by', models.CharField(blank=True, default='', max_length=150)),
                ('forced_reason', models.TextField(blank=True, default='')),
                ('opened_at', models.DateTimeField(blank=True, null=True)),
                ('consecutive_failures', models.IntegerField(default=0)),
                ('window_started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('window_calls', models.IntegerField(default=0)),
                ('window_failures', models.IntegerField(default=0)),
                ('probes_claimed', models.IntegerField(default=0)),
                ('tokens', models.FloatField(default=0.0)),
                ('refilled_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'verbose_name': 'rail',
                'verbose_name_plural': 'rails',
                'permissions': [('force_breaker', "Can force a rail's circuit breaker open or closed")],
            },
        ),
        migrations.AddField(
            model_name='scheduledpayment',
            name='rail',
            field=models.CharField(blank=True, db_default='', default='', max_length=20),
        ),
        migrations.AlterField(
            model_name='executionattempt',
            name='outcome',
            field=models.CharField(choices=[('executed', 'Executed'), ('failed', 'Failed'), ('already_applied', 'Already Applied'), ('stale', 'Stale'), ('error', 'Error'), ('parked', 'Parked'), ('unknown', 'Unknown')], max_length=20),
        ),
        migrations.AlterField(
            model_name='paymentevent',
            name='kind',
            field=models.CharField(choices=[('created', 'Created'), ('cancelled', 'Cancelled'), ('claimed', 'Claimed'), ('reclaimed', 'Reclaimed'), ('executed', 'Executed'), ('failed', 'Failed'), ('retry_scheduled', 'Retry Scheduled'), ('parked', 'Parked'), ('redriven', 'Redriven'), ('updated', 'Updated'), ('outcome_unknown', 'Outcome Unknown')], max_length=20),
        ),
        migrations.AlterField(
            model_name='recurringpayment',
            name='to_account',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.account'),
        ),
        migrations.AlterField(
            model_name='scheduledpayment',
            name='to_account',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='incoming_payments', to='ledger.account'),
        ),
        migrations.CreateModel(
            name='Payee',
            fields=[
                ('id', models.CharField(default=payments.models.new_payee_id, editable=False, max_length=40, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=100)),
                ('rail', models.CharField(choices=[('sandbox', 'Sandbox')], max_length=20)),
                ('destination', models.CharField(max_length=64)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ('deleted_at', models.DateTimeField(blank=True, null=True)),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='payees', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['created_at', 'id'],
            },
        ),
        migrations.AddField(
            model_name='recurringpayment',
            name='to_payee',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='series', to='payments.payee'),
        ),
        migrations.AddField(
            model_name='scheduledpayment',
            name='to_payee',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='payouts', to='payments.payee'),
        ),
        migrations.AddIndex(
            model_name='scheduledpayment',
            index=models.Index(condition=models.Q(('next_attempt_at__isnull', True), ('status', 'SCHEDULED'), models.Q(('rail', ''), _negated=True)), fields=['rail', 'execute_at', 'id'], name='payments_payout_due_idx'),
        ),
        migrations.AddIndex(
            model_name='scheduledpayment',
            index=models.Index(condition=models.Q(('to_payee__isnull', False)), fields=['to_payee', 'status'], name='payments_payee_idx'),
        ),
        migrations.AddConstraint(
            model_name='recurringpayment',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('to_account__isnull', False), ('to_payee__isnull', True)), models.Q(('to_account__isnull', True), ('to_payee__isnull', False)), _connector='OR'), name='recurring_account_xor_payee'),
        ),
        migrations.AddConstraint(
            model_name='scheduledpayment',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('rail', ''), ('to_account__isnull', False), ('to_payee__isnull', True)), models.Q(('to_account__isnull', True), ('to_payee__isnull', False), models.Q(('rail', ''), _negated=True)), _connector='OR'), name='payments_account_xor_payee'),
        ),
        migrations.AddIndex(
            model_name='payout',
            index=models.Index(condition=models.Q(('state', 'paid')), fields=['rail', 'paid_at'], name='payments_payout_paid_idx'),
        ),
        migrations.AddIndex(
            model_name='payout',
            index=models.Index(condition=models.Q(('state', 'pending')), fields=['created_at'], name='payments_payout_pending_idx'),
        ),
        migrations.AddConstraint(
            model_name='payout',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'paid', 'declined', 'voided'])), name='payments_payout_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='payout',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'paid'), _negated=True), models.Q(models.Q(('reference', ''), _negated=True), ('paid_at__isnull', False)), _connector='OR'), name='payments_payout_paid_has_reference'),
        ),
        migrations.AddConstraint(
            model_name='railstate',
            constraint=models.CheckConstraint(condition=models.Q(('breaker__in', ['closed', 'open', 'half_open'])), name='payments_railstate_breaker_valid'),
        ),
        migrations.AddConstraint(
            model_name='railstate',
            constraint=models.CheckConstraint(condition=models.Q(('forced__in', ['', 'open', 'closed'])), name='payments_railstate_forced_valid'),
        ),
        migrations.AddIndex(
            model_name='payee',
            index=models.Index(fields=['owner', 'created_at'], name='payments_payee_owner_idx'),
        ),
        migrations.AddConstraint(
            model_name='payee',
            constraint=models.CheckConstraint(condition=models.Q(('rail__in', ['sandbox'])), name='payments_payee_rail_valid'),
        ),
        migrations.AddConstraint(
            model_name='payee',
            constraint=models.CheckConstraint(condition=models.Q(('destination__regex', '^[A-Za-z0-9_.:-]{1,64}$')), name='payments_payee_destination_valid'),
        ),
        migrations.RunPython(create_rail_accounts, migrations.RunPython.noop),
    ]
