"""What a staff member may not do, and who can change that: the console's 403 page and the
front page of a staff user in no group.

The page names the permission a refusal lacked when the console knows it: a
``MissingPermission`` (common/authz.py, raised by the console's own checks), or, for
Django's own admin pages (a list, an object, add, delete), the model permission the page
needs. The groups that grant a permission are read from the database: the staff groups
``python manage.py staff_groups`` creates (support, auditor, treasury;
payments/management/commands/staff_groups.py declares their permissions), or any an
administrator made.
"""

from dataclasses import dataclass

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.contrib.auth.models import Group, Permission
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from common.authz import MissingPermission

# A model admin page's URL name ends with the page; the permission each page needs.
PAGE_PERMISSIONS = {"changelist": "view", "change": "view", "history": "view", "add": "add", "delete": "delete"}


@dataclass(frozen=True)
class StaffGroupOffer:
    name: str
    grants: str  # what it lets a member do, in words


def needed_permission(request, exception) -> str:
    """``"<app_label>.<codename>"`` of the permission the refusal lacked, or "" when the
    console cannot tell (or the user holds it: the page or act is offered to nobody)."""
    permission = getattr(exception, "permission", "") if isinstance(exception, MissingPermission) else ""
    if not permission:
        permission = _model_page_permission(request)
    if permission and request.user.has_perm(permission):
        return ""
    return permission


def _model_page_permission(request) -> str:
    """The permission of a ModelAdmin's own page (``admin:<app>_<model>_<page>``); a
    POST to a change page needs the change permission."""
    match = getattr(request, "resolver_match", None)
    if match is None or match.namespace != admin.site.name:
        return ""
    for model in admin.site._registry:
        opts = model._meta
        page = (match.url_name or "").removeprefix(f"{opts.app_label}_{opts.model_name}_")
        if page != match.url_name and page in PAGE_PERMISSIONS:
            action = "change" if page == "change" and request.method == "POST" else PAGE_PERMISSIONS[page]
            return f"{opts.app_label}.{get_permission_codename(action, opts)}"
    return ""


def permission_object(permission: str) -> Permission | None:
    app_label, _, codename = permission.partition(".")
    return Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()


def groups_granting(permission: Permission) -> list[str]:
    return list(Group.objects.filter(permissions=permission).order_by("name").values_list("name", flat=True))


def staff_group_offers() -> list[StaffGroupOffer]:
    """Every group with what it lets its members do: reading (its view permissions) and
    the names of its other permissions."""
    offers = []
    for group in Group.objects.prefetch_related("permissions").order_by("name"):
        perms = sorted(group.permissions.all(), key=lambda p: p.name)
        acts = [p.name.removeprefix("Can ") for p in perms if not p.codename.startswith("view_")]
        reads = "reads every page" if any(p.codename.startswith("view_") for p in perms) else "reads nothing"
        grants = f"{reads}; can also {', '.join(acts)}" if acts else f"{reads}, changes nothing"
        offers.append(StaffGroupOffer(group.name, grants))
    return offers


def back_url(request) -> str:
    """Where the page's link goes back to: the page the user came from when it is one of
    this site's (a GET of this very page is a reload: no way back), else the front page."""
    referer = request.META.get("HTTP_REFERER", "")
    same_site = url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()},
                                                require_https=request.is_secure())
    if referer and same_site and (request.method != "GET" or referer != request.build_absolute_uri()):
        return referer
    return reverse("admin:index")


def refusal_page(request, exception=None) -> TemplateResponse:
    """The console's 403: its header and navigation, a way back, the missing permission and
    the groups that grant it."""
    permission = needed_permission(request, exception)
    found = permission_object(permission) if permission else None
    context = {
        **admin.site.each_context(request),
        "title": "Not allowed",
        "subtitle": None,
        "permission": permission,
        "permission_name": found.name if found else "",
        "granting_groups": groups_granting(found) if found else [],
        "back_url": back_url(request),
    }
    return TemplateResponse(request, "admin/refused.html", context, status=403)
