"""Login lockout (django-axes): after DELAYPAY_LOGIN_FAILURE_LIMIT failed logins, one
username from one client address is locked out of the admin and of /auth/token, even with
the right password, for DELAYPAY_LOGIN_COOLOFF_MINUTES. Attempts are database rows: each
test's transaction takes them away, so no test locks another out."""

import io
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client

from tests.api import assert_error, post
from tests.conftest import client_for
from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db

WRONG = "not-the-password"


def admin_login(username, password, **extra):
    return Client().post("/admin/login/?next=/admin/", {"username": username, "password": password}, **extra)


def api_login(username, password, **extra):
    return post(client_for(None), "/api/v1/auth/token", {"username": username, "password": password}, **extra)


def admin_logged_in(response) -> bool:
    if response.status_code == 429:
        return False
    assert response.status_code in (200, 302), response.status_code
    return response.status_code == 302 and response["Location"] == "/admin/"


def api_logged_in(response) -> bool:
    assert response.status_code in (200, 400, 429), response.status_code
    return response.status_code == 200


def assert_admin_locked_out(response):
    assert response.status_code == 429
    assert "too many login attempts" in response.content.decode().lower()


def assert_api_locked_out(response, settings):
    body = assert_error(response, 429, "login_locked_out")
    cool_off = int(settings.AXES_COOLOFF_TIME.total_seconds())
    assert body["retry_after"] == cool_off and response["Retry-After"] == str(cool_off)


def fail(login, username, times, **extra):
    for _ in range(times):
        assert not (admin_logged_in if login is admin_login else api_logged_in)(login(username, WRONG, **extra))


@pytest.fixture
def staff(db):
    return UserFactory(is_staff=True, is_superuser=True)


def test_the_defaults_are_five_failures_and_fifteen_minutes(settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


# --- The admin ---------------------------------------------------------------------------


def test_the_admin_locks_a_username_out_after_the_limit_even_with_the_right_password(staff, settings):
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT - 1)
    assert_admin_locked_out(admin_login(staff.username, WRONG))  # the limit-th failure locks
    assert_admin_locked_out(admin_login(staff.username, PASSWORD))
    assert_api_locked_out(api_login(staff.username, PASSWORD), settings)  # the API shares the count


def test_below_the_limit_the_right_password_still_logs_in_and_forgets_the_failures(staff, settings):
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT - 1)
    assert admin_logged_in(admin_login(staff.username, PASSWORD))
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT - 1)  # counting starts again
    assert admin_logged_in(admin_login(staff.username, PASSWORD))


def test_a_lockout_is_per_username_and_client_address(staff, settings):
    other = UserFactory(is_staff=True, is_superuser=True)
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT)
    assert_admin_locked_out(admin_login(staff.username, PASSWORD))
    assert admin_logged_in(admin_login(other.username, PASSWORD))  # another user, same address
    assert admin_logged_in(admin_login(staff.username, PASSWORD, REMOTE_ADDR="198.51.100.7"))  # same user elsewhere


def test_a_lockout_ends_after_the_cool_off(staff, settings):
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT)
    assert_admin_locked_out(admin_login(staff.username, PASSWORD))
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - settings.AXES_COOLOFF_TIME)
    assert admin_logged_in(admin_login(staff.username, PASSWORD))


def test_axes_reset_unlocks(staff, settings):
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT)
    call_command("axes_reset_username", staff.username, stdout=io.StringIO())
    assert admin_logged_in(admin_login(staff.username, PASSWORD))
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT)
    call_command("axes_reset", stdout=io.StringIO())
    assert admin_logged_in(admin_login(staff.username, PASSWORD))


def test_the_limit_and_cool_off_come_from_the_settings(staff, settings):
    settings.AXES_FAILURE_LIMIT = 2
    fail(admin_login, staff.username, 1)
    assert_admin_locked_out(admin_login(staff.username, WRONG))


def test_force_login_and_other_users_admin_sessions_are_untouched(staff, settings):
    fail(admin_login, staff.username, settings.AXES_FAILURE_LIMIT)
    client = Client()
    client.force_login(staff)  # how the admin tests log in: no password, no lockout check
    assert client.get("/admin/").status_code == 200


# --- POST /auth/token ----------------------------------------------------------------------


def test_the_token_endpoint_locks_out_after_the_limit_even_with_the_right_password(user, settings):
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT - 1)
    assert_error(api_login(user.username, WRONG), 429, "login_locked_out")  # the limit-th failure locks
    assert_api_locked_out(api_login(user.username, PASSWORD), settings)
    assert_admin_locked_out(admin_login(user.username, PASSWORD))


def test_the_token_endpoint_lockout_is_per_username_and_client_address(user, other_user, settings):
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT)
    assert api_logged_in(api_login(other_user.username, PASSWORD))
    assert api_logged_in(api_login(user.username, PASSWORD, REMOTE_ADDR="198.51.100.7"))
    assert_api_locked_out(api_login(user.username, PASSWORD), settings)


def test_an_unknown_username_is_counted_too_without_revealing_it(settings):
    fail(api_login, "nobody-by-this-name", settings.AXES_FAILURE_LIMIT - 1)
    assert_error(api_login("nobody-by-this-name", WRONG), 429, "login_locked_out")


def test_a_token_exchange_forgets_earlier_failures(user, settings):
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT - 1)
    assert api_logged_in(api_login(user.username, PASSWORD))
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT - 1)
    assert api_logged_in(api_login(user.username, PASSWORD))


# --- Behind proxies: the throttles' client address (DELAYPAY_NUM_PROXIES) -----------------


def test_without_trusted_proxies_x_forwarded_for_does_not_escape_a_lockout(user, settings):
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT)
    assert_api_locked_out(api_login(user.username, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.50"), settings)


def test_behind_a_trusted_proxy_the_forwarded_address_is_the_client(user, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    attacker = {"HTTP_X_FORWARDED_FOR": "203.0.113.9"}
    fail(api_login, user.username, settings.AXES_FAILURE_LIMIT, **attacker)
    assert_api_locked_out(api_login(user.username, PASSWORD, **attacker), settings)
    # Another client behind the same proxy (same REMOTE_ADDR) is not locked out.
    assert api_logged_in(api_login(user.username, PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.20"))
    # A client cannot pick its address: the proxy appends the real one, and that is used.
    spoofed = {"HTTP_X_FORWARDED_FOR": "198.51.100.20, 203.0.113.9"}
    assert_api_locked_out(api_login(user.username, PASSWORD, **spoofed), settings)
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.9"}


def test_an_address_that_is_not_an_ip_is_stored_as_unknown_not_an_error(user, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    response = api_login(user.username, WRONG, HTTP_X_FORWARDED_FOR="not-an-address")
    assert_error(response, 400, "invalid_credentials")
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == [None]
