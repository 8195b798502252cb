from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings
        from django.db.models.signals import post_save, pre_save

        from api import tokens

        # A password change revokes the user's API tokens (api/tokens.py).
        user_model = settings.AUTH_USER_MODEL
        pre_save.connect(tokens.remember_password_change, sender=user_model, dispatch_uid="api-tokens-password")
        post_save.connect(
            tokens.revoke_tokens_after_password_change, sender=user_model, dispatch_uid="api-tokens-password"
        )

        # Every ModelAdmin, ours and other apps', answers 403 to an action the user may not
        # run (common/admin_tools.py); the admin's autodiscovery has run by now.
        from django.contrib import admin

        from common.admin_tools import mend_axes_cleanup_action, refuse_unpermitted_actions_everywhere

        mend_axes_cleanup_action(admin.site)
        refuse_unpermitted_actions_everywhere(admin.site)
