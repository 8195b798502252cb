from django.apps import AppConfig


class PayoutsConfig(AppConfig):
    """Payouts: payees, the payout executor, settlement reconciliation."""

    name = "payouts"
