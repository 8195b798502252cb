"""delaypay/settings.py as the environment makes it: the proxy header is trusted only when
told, the database session settings survive a DATABASE_URL with its own options, the
token lifetime and the login lockout come from their variables."""

import runpy
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import RequestFactory

from delaypay.db_options import parameters_set_by, session_options

SETTINGS_FILE = Path(settings.BASE_DIR) / "delaypay" / "settings.py"
OURS = {"jit": "off", "idle_in_transaction_session_timeout": "60000"}
# The session's values in the settings' own units (milliseconds for the timeouts), as SHOW
# would print them rounded to the largest unit ("1min").
SESSION_SETTINGS = (
    "SELECT name, setting FROM pg_settings"
    " WHERE name IN ('idle_in_transaction_session_timeout', 'jit', 'statement_timeout')"
)


def load_settings(monkeypatch, **environ) -> dict:
    """delaypay/settings.py evaluated afresh with ``environ`` added to the environment."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS_FILE))


# --- SECURE_PROXY_SSL_HEADER --------------------------------------------------------------


def test_x_forwarded_proto_is_not_trusted_by_default(monkeypatch):
    monkeypatch.delenv("DJANGO_TRUST_X_FORWARDED_PROTO", raising=False)
    assert load_settings(monkeypatch)["SECURE_PROXY_SSL_HEADER"] is None
    assert settings.SECURE_PROXY_SSL_HEADER is None
    request = RequestFactory().get("/", HTTP_X_FORWARDED_PROTO="https")
    assert not request.is_secure()


def test_plain_http_with_x_forwarded_proto_is_still_redirected_to_https(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    response = client.get("/api/v1/payments", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 301 and response["Location"].startswith("https://")


def test_x_forwarded_proto_is_trusted_when_told(monkeypatch, settings):
    header = load_settings(monkeypatch, DJANGO_TRUST_X_FORWARDED_PROTO="1")["SECURE_PROXY_SSL_HEADER"]
    assert header == ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_PROXY_SSL_HEADER = header
    assert RequestFactory().get("/", HTTP_X_FORWARDED_PROTO="https").is_secure()
    assert not RequestFactory().get("/").is_secure()


# --- Database session options ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ("", set()),
        ("-c jit=on", {"jit"}),
        ("-cjit=on", {"jit"}),
        ("--jit=on", {"jit"}),
        ("-c IDLE_IN_TRANSACTION_SESSION_TIMEOUT=0", {"idle_in_transaction_session_timeout"}),
        ("--idle-in-transaction-session-timeout=5s", {"idle_in_transaction_session_timeout"}),
        ("-c search_path=app\\ schema -c statement_timeout=5s", {"search_path", "statement_timeout"}),
        ("-c application_name=jit\\=on", {"application_name"}),  # an escaped value, not a setting
        ("-c", set()),
    ],
)
def test_parameters_set_by_reads_options_as_the_server_does(options, names):
    assert parameters_set_by(options) == names


def test_without_url_options_both_settings_are_set():
    assert session_options(None, OURS) == "-c jit=off -c idle_in_transaction_session_timeout=60000"
    assert session_options("  ", OURS) == "-c jit=off -c idle_in_transaction_session_timeout=60000"


def test_url_options_are_kept_and_ours_added():
    merged = session_options("-c search_path=app -c statement_timeout=5s", OURS)
    assert merged == (
        "-c search_path=app -c statement_timeout=5s -c jit=off -c idle_in_transaction_session_timeout=60000"
    )


def test_a_setting_the_url_options_make_wins():
    assert session_options("-c jit=on", OURS) == "-c jit=on -c idle_in_transaction_session_timeout=60000"
    assert session_options("--idle-in-transaction-session-timeout=0", OURS) == (
        "--idle-in-transaction-session-timeout=0 -c jit=off"
    )
    assert session_options("-c jit=on -c idle_in_transaction_session_timeout=0", OURS) == (
        "-c jit=on -c idle_in_transaction_session_timeout=0"
    )


def test_settings_merge_the_url_options(monkeypatch):
    loaded = load_settings(
        monkeypatch,
        DATABASE_URL="postgres://u@db.internal:5432/pay?options=-c%20search_path%3Dapp&sslmode=require"
        "&connect_timeout=9",
        DELAYPAY_LEASE_SECONDS="42",
    )
    options = loaded["DATABASES"]["default"]["OPTIONS"]
    assert options == {
        "options": "-c search_path=app -c jit=off -c idle_in_transaction_session_timeout=42000",
        "sslmode": "require",
        "connect_timeout": 9,  # the URL's own wins
    }


def test_settings_without_url_options(monkeypatch):
    loaded = load_settings(monkeypatch, DATABASE_URL="postgres://u@db.internal:5432/pay", DELAYPAY_LEASE_SECONDS="42")
    assert loaded["DATABASES"]["default"]["OPTIONS"] == {
        "options": "-c jit=off -c idle_in_transaction_session_timeout=42000",
        "connect_timeout": 5,  # DELAYPAY_DB_CONNECT_TIMEOUT_SECONDS: a frozen host is given up on
    }


@pytest.mark.django_db
def test_a_real_connection_from_a_url_with_options_has_every_setting(monkeypatch):
    """settings.py's options, against the real server: the URL's own setting and both of ours."""
    database = connection.settings_dict
    url = f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
    loaded = load_settings(
        monkeypatch, DATABASE_URL=f"{url}?options=-c%20statement_timeout%3D4321", DELAYPAY_LEASE_SECONDS="42"
    )
    config = loaded["DATABASES"]["default"]
    with psycopg.connect(
        dbname=config["NAME"],
        user=config["USER"],
        password=config["PASSWORD"] or None,
        host=config["HOST"],
        port=config["PORT"],
        options=config["OPTIONS"]["options"],
    ) as conn:
        shown = dict(conn.execute(SESSION_SETTINGS).fetchall())
    assert shown == {"idle_in_transaction_session_timeout": "42000", "jit": "off", "statement_timeout": "4321"}


@pytest.mark.django_db
def test_the_test_connection_has_the_session_settings():
    with connection.cursor() as cursor:
        cursor.execute(SESSION_SETTINGS)
        shown = dict(cursor.fetchall())
    assert shown["idle_in_transaction_session_timeout"] == str(int(settings.DELAYPAY_LEASE_SECONDS * 1000))
    assert shown["jit"] == "off"


# --- Tokens and the login lockout --------------------------------------------------------------


def test_token_lifetime_and_lockout_come_from_the_environment(monkeypatch):
    loaded = load_settings(
        monkeypatch,
        DELAYPAY_TOKEN_TTL_HOURS="0.5",
        DELAYPAY_LOGIN_FAILURE_LIMIT="7",
        DELAYPAY_LOGIN_COOLOFF_MINUTES="2.5",
    )
    assert loaded["REST_KNOX"]["TOKEN_TTL"] == timedelta(minutes=30)
    assert loaded["AXES_FAILURE_LIMIT"] == 7
    assert loaded["AXES_COOLOFF_TIME"] == timedelta(minutes=2, seconds=30)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DELAYPAY_TOKEN_TTL_HOURS", "0"),  # a token that never expires is what this replaced
        ("DELAYPAY_LOGIN_FAILURE_LIMIT", "0"),
        ("DELAYPAY_LOGIN_COOLOFF_MINUTES", "0"),  # axes would lock out for ever
        ("DELAYPAY_LOGIN_COOLOFF_MINUTES", "-1"),
    ],
)
def test_a_zero_or_negative_value_is_refused(monkeypatch, name, value):
    with pytest.raises(ImproperlyConfigured, match=name):
        load_settings(monkeypatch, **{name: value})


# --- Redis, plain or behind Sentinel ------------------------------------------------------------

SENTINEL_URL = "sentinel://127.0.0.1:26379/1;sentinel://127.0.0.1:26380/1"


def test_a_plain_redis_url_configures_celery_and_the_cache_as_before(monkeypatch):
    monkeypatch.delenv("DELAYPAY_CACHE_URL", raising=False)
    loaded = load_settings(monkeypatch, REDIS_URL="redis://127.0.0.1:6379/4")
    assert loaded["CELERY_BROKER_URL"] == "redis://127.0.0.1:6379/4"
    assert "master_name" not in loaded["CELERY_BROKER_TRANSPORT_OPTIONS"]
    assert loaded["CELERY_BROKER_TRANSPORT_OPTIONS"]["max_retries"] == 2
    cache = loaded["CACHES"]["default"]
    assert (cache["LOCATION"], cache["OPTIONS"]) == (
        "redis://127.0.0.1:6379/4", {"socket_connect_timeout": 1, "socket_timeout": 1})


def test_a_sentinel_url_configures_celery_and_the_cache_for_the_named_master(monkeypatch):
    monkeypatch.delenv("DELAYPAY_CACHE_URL", raising=False)
    monkeypatch.delenv("DELAYPAY_REDIS_SENTINEL_MASTER", raising=False)
    loaded = load_settings(monkeypatch, REDIS_URL=SENTINEL_URL, DELAYPAY_REDIS_SENTINEL_PASSWORD="spw")
    assert loaded["CELERY_BROKER_URL"] == SENTINEL_URL
    options = loaded["CELERY_BROKER_TRANSPORT_OPTIONS"]
    assert options["master_name"] == "delaypay"  # the default name
    assert options["sentinel_kwargs"] == {"socket_timeout": 5, "socket_connect_timeout": 2, "password": "spw"}
    assert (options["max_retries"], options["interval_max"]) == (2, 0.5)  # publishing still fails fast
    cache = loaded["CACHES"]["default"]
    assert cache["LOCATION"] == [SENTINEL_URL]
    assert cache["OPTIONS"]["pool_class"] == "common.redis_url.SentinelPool"
    assert (cache["OPTIONS"]["master_name"], cache["OPTIONS"]["sentinel_password"]) == ("delaypay", "spw")


@pytest.mark.parametrize(("environ", "says"), [
    ({"REDIS_URL": SENTINEL_URL, "DELAYPAY_REDIS_SENTINEL_MASTER": ""}, "REDIS_URL: a Sentinel URL needs"),
    ({"REDIS_URL": "sentinel://h1:1/0;redis://h2:2/0"}, "REDIS_URL: every part"),
    ({"DELAYPAY_CACHE_URL": "sentinel://h1:x/0"}, "DELAYPAY_CACHE_URL: .* not a number"),
])
def test_a_bad_sentinel_configuration_is_refused_at_start(monkeypatch, environ, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        load_settings(monkeypatch, **environ)


# --- The autoscaling signal (payments/scaling.py) -----------------------------------------


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({"DELAYPAY_SCALE_PROCESS_RATE": "0"}, "DELAYPAY_SCALE_PROCESS_RATE"),  # a division by zero
        ({"DELAYPAY_SCALE_DRAIN_SECONDS": "0"}, "DELAYPAY_SCALE_DRAIN_SECONDS"),
        ({"DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS": "-60"}, "DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS"),
        ({"DELAYPAY_SCALE_TARGET_UTILIZATION": "0"}, "DELAYPAY_SCALE_TARGET_UTILIZATION"),
        ({"DELAYPAY_SCALE_TARGET_UTILIZATION": "1.5"}, "DELAYPAY_SCALE_TARGET_UTILIZATION"),  # busier than busy
        ({"DELAYPAY_SCALE_MIN_WORKERS": "9", "DELAYPAY_SCALE_MAX_WORKERS": "8"}, "DELAYPAY_SCALE_MIN_WORKERS"),
        ({"DELAYPAY_SCALE_MIN_WORKERS": "-1"}, "DELAYPAY_SCALE_MIN_WORKERS"),
        ({"DELAYPAY_SCALE_MIN_WORKERS": "0", "DELAYPAY_SCALE_MAX_WORKERS": "0"}, "DELAYPAY_SCALE_MAX_WORKERS"),
    ],
)
def test_scaling_settings_that_make_no_sense_are_refused(monkeypatch, environ, name):
    with pytest.raises(ImproperlyConfigured, match=name):
        load_settings(monkeypatch, **environ)


def test_scaling_settings_come_from_the_environment(monkeypatch):
    loaded = load_settings(
        monkeypatch, DELAYPAY_SCALE_PROCESS_RATE="1500", DELAYPAY_SCALE_TARGET_UTILIZATION="1",
        DELAYPAY_SCALE_MIN_WORKERS="0", DELAYPAY_SCALE_MAX_WORKERS="8",
    )
    assert (loaded["DELAYPAY_SCALE_PROCESS_RATE"], loaded["DELAYPAY_SCALE_TARGET_UTILIZATION"]) == (1500.0, 1.0)
    assert (loaded["DELAYPAY_SCALE_MIN_WORKERS"], loaded["DELAYPAY_SCALE_MAX_WORKERS"]) == (0, 8)
