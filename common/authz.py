"""Who may read or act on someone else's objects: the one rule the API shares with the admin.

Everyone reads and acts on their own objects (the selectors say what "own" is). Staff
reach someone else's only through a model permission, the one the admin asks for:

* reading needs the model's view permission (or its change permission: the admin's
  ``has_view_permission`` counts either);
* an act (cancel, re-drive, pause, deposit, ...) needs the act's permission, and is done
  only on an object the user may read.

``is_staff`` alone grants nothing: a staff user without the permission is an ordinary
user for that read or act. Superusers hold every permission.
"""

from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied


def staff_may(user, permission: str) -> bool:
    """Whether ``user`` (None or anonymous: no) is staff holding ``permission``
    (``"<app_label>.<codename>"``)."""
    return bool(getattr(user, "is_staff", False) and user.has_perm(permission))


def staff_may_view(user, model) -> bool:
    """Whether ``user`` may read every row of ``model``, as in the admin: staff with the
    model's view or change permission."""
    opts = model._meta
    return any(
        staff_may(user, f"{opts.app_label}.{get_permission_codename(action, opts)}") for action in ("view", "change")
    )


class ConflictOfInterest(Exception):
    """A staff act refused because the actor would benefit from it: a deposit approved
    into, or a freeze lifted from, an account they own; a re-drive or resolve of a payment
    they created or are a party to. Someone else must do it (403 ``conflict_of_interest``;
    docs/explanation/threat-model.md)."""

    code = "conflict_of_interest"

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class MissingPermission(PermissionDenied):
    """A console page or act refused for want of ``permission`` (``"<app_label>.<codename>"``):
    the 403 page names it and the staff groups that grant it (console/refusal.py)."""

    def __init__(self, permission: str):
        super().__init__(f"This needs the permission {permission}.")
        self.permission = permission
