"""API tokens (django-rest-knox) and login records (django-axes) are view-only in the
console, superusers included (issue 36, point 5): their pages show no editable field, and a
POST to add or change them is refused with 403."""

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib.admin.utils import quote
from django.urls import reverse
from knox.models import AuthToken

from tests.conftest import admin_client_for
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

LOGIN = {"ip_address": "192.0.2.1", "user_agent": "test", "http_accept": "*/*", "path_info": "/admin/login/"}


def token_row():
    owner = UserFactory()
    token, _ = AuthToken.objects.create(owner)
    return token


def attempt_row():
    return AccessAttempt.objects.create(**LOGIN, username="u", get_data="", post_data="", failures_since_start=1)


def access_log_row():
    return AccessLog.objects.create(**LOGIN, username="u")


def failure_log_row():
    return AccessFailureLog.objects.create(**LOGIN, username="u", locked_out=False)


ROWS = {
    "knox_authtoken": token_row,
    "axes_accessattempt": attempt_row,
    "axes_accesslog": access_log_row,
    "axes_accessfailurelog": failure_log_row,
}


@pytest.mark.parametrize("admin_name", ROWS)
def test_the_change_page_shows_no_editable_field_to_a_superuser(superuser, admin_name):
    row = ROWS[admin_name]()
    page = admin_client_for(superuser).get(reverse(f"admin:{admin_name}_change", args=[quote(row.pk)]))
    assert page.status_code == 200
    assert page.context["adminform"].form.fields == {}  # every field is shown read-only
    assert page.context["has_change_permission"] is False
    content = page.content.decode()
    assert 'name="_save"' not in content
    assert "<textarea" not in content and 'type="text"' not in content


@pytest.mark.parametrize("admin_name", ROWS)
def test_a_post_to_change_or_add_is_refused_for_a_superuser(superuser, admin_name):
    row = ROWS[admin_name]()
    client = admin_client_for(superuser)
    change = client.post(reverse(f"admin:{admin_name}_change", args=[quote(row.pk)]), {"_save": "Save"})
    add = client.post(reverse(f"admin:{admin_name}_add"), {"_save": "Save"})
    assert (change.status_code, add.status_code) == (403, 403)
    assert type(row).objects.filter(pk=row.pk).count() == 1


def test_a_token_cannot_be_added_extended_or_moved(superuser):
    token = token_row()
    other = UserFactory()
    expiry = token.expiry
    client = admin_client_for(superuser)
    url = reverse("admin:knox_authtoken_change", args=[quote(token.pk)])
    response = client.post(url, {"user": other.pk, "expiry_0": "2099-01-01", "expiry_1": "00:00:00"})
    assert response.status_code == 403
    token.refresh_from_db()
    assert (token.user_id, token.expiry) != (other.pk, None) and token.expiry == expiry
    assert client.post(reverse("admin:knox_authtoken_add"), {"user": other.pk}).status_code == 403
    assert AuthToken.objects.count() == 1
    listing = client.get(reverse("admin:knox_authtoken_changelist"))
    assert listing.status_code == 200 and not listing.context["has_add_permission"]


@pytest.mark.parametrize("admin_name", ["knox_authtoken", "axes_accesslog", "axes_accessfailurelog"])
def test_tokens_and_login_logs_cannot_be_deleted_in_the_console(superuser, admin_name):
    """Revoking a token here would record no reason (deactivate the user instead); the
    login logs are an audit trail."""
    row = ROWS[admin_name]()
    client = admin_client_for(superuser)
    response = client.post(reverse(f"admin:{admin_name}_delete", args=[quote(row.pk)]), {"post": "yes"})
    assert response.status_code == 403
    assert type(row).objects.filter(pk=row.pk).exists()


def test_a_lockout_can_still_be_lifted_by_deleting_its_attempt(superuser):
    """An AccessAttempt is the lockout itself: deleting it is how django-axes lifts one."""
    row = attempt_row()
    client = admin_client_for(superuser)
    response = client.post(reverse("admin:axes_accessattempt_delete", args=[quote(row.pk)]), {"post": "yes"})
    assert response.status_code == 302
    assert not AccessAttempt.objects.filter(pk=row.pk).exists()
