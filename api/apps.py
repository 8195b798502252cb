from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The HTTP edge: the REST API under /api/v1/."""

    name = "api"

    def ready(self):
        from django.conf import settings
        from django.db.models.signals import post_save, pre_save

        from . import tokens

        # A password change revokes the user's API tokens (api/tokens.py).
        user_model = settings.AUTH_USER_MODEL
        pre_save.connect(tokens.remember_password_change, sender=user_model, dispatch_uid="api-tokens-password")
        post_save.connect(
            tokens.revoke_tokens_after_password_change, sender=user_model, dispatch_uid="api-tokens-password"
        )
