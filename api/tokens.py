"""API tokens (django-rest-knox): issued by ``POST /auth/token``, valid for
``DELAYPAY_TOKEN_TTL_HOURS``, revoked by ``POST /auth/logout`` (the token used),
``POST /auth/logout-all`` (all of the user's) and by any change of the user's password.

Only a token's SHA-512 digest is stored: the key is shown once, when it is issued.
"""

from django.utils import timezone
from knox.models import AuthToken


def api_token_issue(*, user) -> tuple[AuthToken, str]:
    """A new token for ``user``: its row (``expiry``) and its key. The user's expired tokens
    are deleted on the way (authentication checks only the token presented)."""
    AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()
    return AuthToken.objects.create(user=user)


def api_tokens_purge_expired() -> int:
    """Delete every expired token, of any user (beat: hourly); returns how many. A user
    who never signs in again would otherwise keep theirs for ever."""
    deleted, _ = AuthToken.objects.filter(expiry__lt=timezone.now()).delete()
    return deleted


def api_token_revoke(*, token: AuthToken) -> None:
    token.delete()


def api_tokens_revoke_all(*, user_id: int) -> int:
    """Delete every token of the user; returns how many there were."""
    deleted, _ = AuthToken.objects.filter(user_id=user_id).delete()
    return deleted


# --- A password change revokes every token ----------------------------------------------
#
# Connected in PaymentsConfig.ready() for the user model. Whatever changes the stored hash
# through save() counts: set_password() + save() (the admin's password form, the
# changepassword command, Django's password change views), set_unusable_password(), an
# assignment to ``password``. So does the hash Django rewrites when it upgrades a hasher
# at login: the user's other tokens go once, after such an upgrade (the token being issued
# is created after it). QuerySet.update(password=...) bypasses save() and is not seen.


def remember_password_change(sender, instance, raw=False, update_fields=None, **kwargs):
    """pre_save: note whether this save changes the stored password hash."""
    instance._api_tokens_stale = False
    if raw or instance._state.adding or instance.pk is None:
        return
    if update_fields is not None and "password" not in update_fields:
        return  # e.g. last_login at every login: no query
    stored = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._api_tokens_stale = stored is not None and stored != instance.password


def revoke_tokens_after_password_change(sender, instance, raw=False, **kwargs):
    """post_save: the hash changed, so every token issued under the old password goes."""
    if getattr(instance, "_api_tokens_stale", False):
        instance._api_tokens_stale = False
        api_tokens_revoke_all(user_id=instance.pk)
