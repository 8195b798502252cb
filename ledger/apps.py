from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from common.db import reset_lock_timeout, set_migration_lock_timeout

        # Every app's migrations run under the lock timeout (the first app with models
        # connects it once for all).
        pre_migrate.connect(set_migration_lock_timeout, dispatch_uid="delaypay-migration-lock-timeout")
        post_migrate.connect(reset_lock_timeout, dispatch_uid="delaypay-migration-lock-timeout-reset")
