"""API tokens (django-rest-knox): they expire, can be revoked one at a time or all
together, and die with the password they were issued under."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.exceptions import AuthenticationFailed

from api.authentication import TokenAuthentication
from api.tasks import purge_expired_tokens
from payments.fields import parse_rfc3339
from tests.api import assert_error, post
from tests.conftest import admin_client_for, client_for
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def issue(user, password=PASSWORD):
    return post(client_for(None), "/api/v1/auth/token", {"username": user.username, "password": password})


def bearer(key: str):
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def works(key: str) -> bool:
    status = bearer(key).get("/api/v1/accounts").status_code
    assert status in (200, 401), status
    return status == 200


def assert_revoked(key: str):
    response = bearer(key).get("/api/v1/accounts")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Token")


# --- Issue -------------------------------------------------------------------------------


def test_a_token_is_issued_with_its_expiry_and_only_its_digest_is_stored(user, settings):
    before = timezone.now()
    response = issue(user)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"token", "expires_at"}
    assert body["expires_at"].endswith("Z")
    ttl = timedelta(hours=settings.DELAYPAY_TOKEN_TTL_HOURS)
    assert before + ttl <= parse_rfc3339(body["expires_at"]) <= timezone.now() + ttl
    row = AuthToken.objects.get(user=user)
    assert body["token"] not in (row.digest, row.token_key) and body["token"].startswith(row.token_key)
    assert works(body["token"])


def test_the_default_lifetime_is_24_hours(settings):
    assert settings.DELAYPAY_TOKEN_TTL_HOURS == 24
    assert settings.REST_KNOX["TOKEN_TTL"] == timedelta(hours=24)


def test_the_lifetime_follows_the_setting(user, settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": timedelta(minutes=5)}
    expires_at = parse_rfc3339(issue(user).json()["expires_at"])
    assert timedelta(minutes=4) < expires_at - timezone.now() <= timedelta(minutes=5)


def test_every_exchange_issues_a_new_token_and_the_earlier_ones_keep_working(user):
    first, second = issue(user).json()["token"], issue(user).json()["token"]
    assert first != second
    assert works(first) and works(second)
    user.refresh_from_db()
    assert user.last_login is not None  # the exchange is a login


def test_an_expired_token_is_401_and_deleted(user):
    key = issue(user).json()["token"]
    AuthToken.objects.filter(user=user).update(expiry=timezone.now() - timedelta(seconds=1))
    assert_revoked(key)
    assert not AuthToken.objects.filter(user=user).exists()


def test_a_token_is_refused_once_its_lifetime_has_passed(user, settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": timedelta(seconds=-1)}  # issued already expired
    assert_revoked(issue(user).json()["token"])


def test_issuing_deletes_the_users_expired_tokens_and_no_one_elses(user, other_user):
    stale, _ = AuthToken.objects.create(user, expiry=timedelta(seconds=-1))
    others_stale, _ = AuthToken.objects.create(other_user, expiry=timedelta(seconds=-1))
    issue(user)
    assert not AuthToken.objects.filter(pk=stale.pk).exists()
    assert AuthToken.objects.filter(pk=others_stale.pk).exists()


def test_the_hourly_purge_deletes_every_expired_token_and_only_those(user, other_user, settings):
    live_key = issue(user).json()["token"]
    AuthToken.objects.create(user, expiry=timedelta(seconds=-1))
    AuthToken.objects.create(other_user, expiry=timedelta(seconds=-1))  # never signs in again
    assert settings.CELERY_BEAT_SCHEDULE["purge-expired-tokens"]["task"] == purge_expired_tokens.name
    assert purge_expired_tokens() == {"deleted": 2}
    assert list(AuthToken.objects.values_list("user_id", flat=True)) == [user.pk]
    assert works(live_key)


def test_old_rest_framework_tokens_are_refused():
    assert_revoked("0123456789abcdef0123456789abcdef01234567")  # DRF's 40 hex characters


@pytest.mark.parametrize(
    "key",
    [
        "A" * 64,  # upper case: knox issues lower-case hex
        "0" * 63,
        "0" * 65,
        "g" * 64,
        "\xff" * 64,  # not UTF-8 once encoded: knox would fail decoding it
        "0" * 32 + "\x00" + "0" * 31,
    ],
)
def test_a_malformed_key_is_401_without_a_query(key, django_assert_num_queries):
    with django_assert_num_queries(0):
        with pytest.raises(AuthenticationFailed):
            TokenAuthentication().authenticate_credentials(key.encode("latin-1"))
    assert_revoked(key)


def test_an_unknown_well_formed_key_is_401():
    assert_revoked("0" * 64)


# --- Logout ------------------------------------------------------------------------------


def test_logout_revokes_the_token_used_and_only_that_one(user, other_user):
    used, kept, others = issue(user).json()["token"], issue(user).json()["token"], issue(other_user).json()["token"]
    response = bearer(used).post("/api/v1/auth/logout")
    assert response.status_code == 204 and response.content == b""
    assert_revoked(used)
    assert works(kept) and works(others)
    assert_revoked(used)  # and logging out again with it is 401, not an error
    assert_error(bearer(used).post("/api/v1/auth/logout"), 401, "not_authenticated")


def test_logout_all_revokes_every_token_of_the_user_and_no_one_elses(user, other_user):
    keys, others = [issue(user).json()["token"] for _ in range(3)], issue(other_user).json()["token"]
    response = bearer(keys[0]).post("/api/v1/auth/logout-all")
    assert response.status_code == 204 and response.content == b""
    for key in keys:
        assert_revoked(key)
    assert works(others)
    assert not AuthToken.objects.filter(user=user).exists()
    assert works(issue(user).json()["token"])  # a new login works as ever


@pytest.mark.parametrize("path", ["/api/v1/auth/logout", "/api/v1/auth/logout-all"])
def test_logout_needs_a_token(path):
    response = client_for(None).post(path)
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Token")


@pytest.mark.parametrize("path", ["/api/v1/auth/logout", "/api/v1/auth/logout-all"])
def test_logout_is_post_only(user, path):
    assert_error(bearer(issue(user).json()["token"]).get(path), 405, "method_not_allowed")


# --- A password change revokes every token ----------------------------------------------


def test_set_password_and_save_revokes_the_users_tokens_and_no_one_elses(user, other_user):
    keys, others = [issue(user).json()["token"] for _ in range(2)], issue(other_user).json()["token"]
    user.set_password("a-brand-new-password-42")
    user.save()
    for key in keys:
        assert_revoked(key)
    assert works(others)
    assert works(issue(user, "a-brand-new-password-42").json()["token"])


def test_the_admin_password_form_revokes_the_users_tokens(user, superuser):
    key = issue(user).json()["token"]
    admin = admin_client_for(superuser)
    response = admin.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": "a-brand-new-password-42", "password2": "a-brand-new-password-42", "usable_password": "true"},
    )
    assert response.status_code == 302, response.content[:500]
    user.refresh_from_db()
    assert user.check_password("a-brand-new-password-42")
    assert_revoked(key)


def test_disabling_password_login_revokes_the_users_tokens(user):
    key = issue(user).json()["token"]
    user.set_unusable_password()
    user.save()
    assert_revoked(key)


def test_saving_a_user_without_changing_the_password_keeps_the_tokens(user, superuser):
    key = issue(user).json()["token"]
    user.first_name = "Ada"
    user.save()
    user.save(update_fields=["last_login"])
    get_user_model().objects.get(pk=user.pk).save()
    admin = admin_client_for(superuser)
    response = admin.post(
        f"/admin/auth/user/{user.pk}/change/",
        {"username": user.username, "first_name": "Ada", "last_name": "", "email": "", "is_active": "on",
         "date_joined_0": "2030-01-01", "date_joined_1": "00:00:00", "initial-date_joined_0": "2030-01-01",
         "initial-date_joined_1": "00:00:00"},
    )
    assert response.status_code == 302, response.content[:2000]
    assert works(key)


def test_an_admin_login_does_not_revoke_the_users_tokens(superuser):
    key = AuthToken.objects.create(superuser)[1]
    assert Client().post("/admin/login/", {"username": superuser.username, "password": PASSWORD}).status_code == 302
    assert works(key)


# --- The schema ----------------------------------------------------------------------------


def test_the_schema_documents_the_auth_endpoints():
    schema = client_for(None).get("/api/v1/schema", {"format": "json"}).json()
    token = schema["paths"]["/api/v1/auth/token"]["post"]
    assert token["tags"] == ["auth"] and "429" in token["responses"] and "login_locked_out" in str(token)
    response = schema["components"]["schemas"]["TokenResponse"]
    assert set(response["required"]) == {"token", "expires_at"}
    assert response["properties"]["expires_at"]["format"] == "date-time"
    for path in ("/api/v1/auth/logout", "/api/v1/auth/logout-all"):
        operation = schema["paths"][path]["post"]
        assert operation["tags"] == ["auth"]
        assert operation["security"] == [{"tokenAuth": []}]
        assert {"204", "401"} <= set(operation["responses"])
        assert "content" not in operation["responses"]["204"]
    assert schema["components"]["securitySchemes"]["tokenAuth"] == {
        "type": "apiKey", "in": "header", "name": "Authorization",
        "description": 'Token-based authentication with required prefix "Token"',
    }
    assert "login_locked_out" in schema["components"]["schemas"]["ErrorCodeEnum"]["enum"]
