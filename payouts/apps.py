from django.apps import AppConfig


class PayoutsConfig(AppConfig):
    """Payouts: payees, the payout executor, settlement reconciliation."""

    name = "payouts"

    def ready(self):
        # The engine's review queue resolves a parked payout through its rail; it calls no
        # rail itself, so the payouts register the resolve with it.
        from payments import services

        from .payees import payout_resolve_failed

        services.register_parked_payout_resolver(payout_resolve_failed)
