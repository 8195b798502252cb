"""delaypay settings: twelve-factor, everything from the environment.

Every variable read here is listed in docs/reference/configuration.md.
"""

import os
from datetime import timedelta
from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

import delaypay
from common import redis_url
from delaypay.db_options import session_options
from delaypay.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DJANGO_DEBUG", default=False)

# A development key only when DEBUG is on; production must bring its own.
if DEBUG:
    SECRET_KEY = env("DJANGO_SECRET_KEY", default="dev-only-insecure-key-not-for-production-use-0123456789")
else:
    SECRET_KEY = env("DJANGO_SECRET_KEY")

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",  # expiring, revocable API tokens (api/tokens.py)
    "axes",  # login lockout after repeated failures (admin and /auth/token)
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets served from our own static files (no CDN)
    "ledger",
    "payments",
    "webhooks",
    # No models of their own (the models are in payments): payouts and recurring hold the
    # payout executor and the series, api the HTTP edge, console the payments console (its
    # admin module, templates and template tags). docs/reference/code-layout.md
    "payouts",
    "recurring",
    "api",
    "console",
    # Development and verification tools (bench, chaos, synthesize_history,
    # admin_page_timings): management commands only, no models, nothing the product imports.
    "devtools",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "delaypay.logs.RequestLogMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns the admin login's lockout into its 429 page; innermost but for the metrics.
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "delaypay.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # {% load console %}: the console's tags shared by every app's admin templates.
            "libraries": {"console": "common.console_tags"},
        },
    },
]

WSGI_APPLICATION = "delaypay.wsgi.application"

# --- Database: PostgreSQL is the only source of truth ---------------------------------

DATABASES = {
    "default": env.db_url("DATABASE_URL", default="postgres://root@127.0.0.1:5432/delaypay"),
}
# Workers keep their connection between tasks (see delaypay/celery.py); web requests
# reuse theirs for CONN_MAX_AGE seconds. Health checks drop a connection that died
# (a PostgreSQL restart) before it is used again.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Every query here is short OLTP work; PostgreSQL's JIT compiles whenever a cost
# estimate is high (set-based batch statements, generate_series joins) and spends more
# milliseconds compiling than the query takes. And no delaypay process ever waits inside
# a transaction: a session idle in one for a whole lease is a stalled worker (a paused
# VM, a process in swap) holding its batch's row locks, which keeps those payments from
# being re-claimed; PostgreSQL ends it and the worker's late commit fails as stale.
# Both are added to the options a DATABASE_URL brings (?options=-c%20search_path%3Dapp):
# its own settings are kept, and where it sets jit or the timeout itself, it wins.
_database_options = DATABASES["default"].setdefault("OPTIONS", {})
_database_options["options"] = session_options(
    _database_options.get("options"),
    {
        "jit": "off",
        "idle_in_transaction_session_timeout": str(int(env.float("DELAYPAY_LEASE_SECONDS", default=60.0) * 1000)),
    },
)
# A server that stops answering without closing its connections (a frozen primary) is
# given up on by the client: connecting waits at most connect_timeout seconds per host
# of the URL (libpq; a URL's own value wins), and in the serving processes a command
# busy for DELAYPAY_DB_COMMAND_DEADLINE_SECONDS has its socket shut down
# (common/db_deadline.py; 0: never). Above any command of the money path and the console,
# lock waits included; manage.py commands (migrate) and the maintenance tasks
# (reconciliation, archival) are never cut.
_database_options.setdefault("connect_timeout", env.int("DELAYPAY_DB_CONNECT_TIMEOUT_SECONDS", default=5))
DELAYPAY_DB_COMMAND_DEADLINE_SECONDS = env.float("DELAYPAY_DB_COMMAND_DEADLINE_SECONDS", default=15.0)
if not 0 <= DELAYPAY_DB_COMMAND_DEADLINE_SECONDS <= 3600:
    raise ImproperlyConfigured("DELAYPAY_DB_COMMAND_DEADLINE_SECONDS must be between 0 and 3600.")
# How long each statement of `migrate` waits for a lock before it fails (0: no limit).
# A migration queued behind a long transaction would otherwise queue every statement of
# the money path behind itself (common/db.py, set_migration_lock_timeout).
DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS = env.float("DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS", default=5.0)
if not 0 <= DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS <= 3600:
    raise ImproperlyConfigured("DELAYPAY_MIGRATION_LOCK_TIMEOUT_SECONDS must be between 0 and 3600.")
DATABASES["default"].setdefault("TEST", {})
if env("DJANGO_TEST_DATABASE_NAME", default=""):
    DATABASES["default"]["TEST"]["NAME"] = env("DJANGO_TEST_DATABASE_NAME")

# A streaming read replica (docs/how-to/read-replica.md): when set, GET and HEAD of the API's
# payment, account, recurring and payee views read there (delaypay/db_router.py), unless the
# user wrote within READ_YOUR_WRITES seconds or the replica is down or more than MAX_LAG
# seconds behind (checked at most every CHECK seconds per process). Everything else, every
# write and every migration stays on the primary. Unset: no router, no middleware, no alias.
DATABASE_REPLICA_URL = env("DATABASE_REPLICA_URL", default="")
DELAYPAY_REPLICA_MAX_LAG_SECONDS = env.float("DELAYPAY_REPLICA_MAX_LAG_SECONDS", default=2.0)
DELAYPAY_REPLICA_CHECK_SECONDS = env.float("DELAYPAY_REPLICA_CHECK_SECONDS", default=1.0)
DELAYPAY_READ_YOUR_WRITES_SECONDS = env.float("DELAYPAY_READ_YOUR_WRITES_SECONDS", default=5.0)
if min(DELAYPAY_REPLICA_MAX_LAG_SECONDS, DELAYPAY_REPLICA_CHECK_SECONDS) <= 0 or DELAYPAY_READ_YOUR_WRITES_SECONDS < 0:
    raise ImproperlyConfigured(
        "DELAYPAY_REPLICA_MAX_LAG_SECONDS and DELAYPAY_REPLICA_CHECK_SECONDS must be above 0, "
        "DELAYPAY_READ_YOUR_WRITES_SECONDS 0 or more"
    )
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = env.db_url_config(DATABASE_REPLICA_URL)
    DATABASES["replica"]["CONN_MAX_AGE"] = DATABASES["default"]["CONN_MAX_AGE"]
    DATABASES["replica"]["CONN_HEALTH_CHECKS"] = True
    _replica_options = DATABASES["replica"].setdefault("OPTIONS", {})
    _replica_options["options"] = session_options(_replica_options.get("options"), {"jit": "off"})
    # A replica that does not answer must cost a request little (libpq's minimum is 2 s).
    _replica_options.setdefault("connect_timeout", 2)
    # Tests run with a replica configured read the test database through it.
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
    DATABASE_ROUTERS = ["delaypay.db_router.PrimaryReplicaRouter"]
    # Innermost: it wraps the view alone (and answers a read again from the primary when
    # the replica fails during it, before any other middleware sees the error).
    MIDDLEWARE.append("delaypay.read_routing.ReadReplicaMiddleware")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
FORMAT_MODULE_PATH = ["delaypay.formats"]  # ISO dates with seconds in the admin

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

# --- Security (checked by `manage.py check --deploy` with DJANGO_DEBUG=0) ------------

# X-Forwarded-Proto is believed only when a TLS proxy in front sets it (and replaces a
# client's own): believed from anyone, a plain-HTTP client could pass for HTTPS.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env.bool("DJANGO_TRUST_X_FORWARDED_PROTO", default=False) else None
)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- Login lockout (django-axes): the admin's login form and POST /auth/token -----------

AUTHENTICATION_BACKENDS = [
    # First: a locked-out username and client address is refused before any password check.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]


def _positive(name: str, value: float) -> float:
    if value <= 0:
        raise ImproperlyConfigured(f"{name} must be above 0, not {value}")
    return value


# Failed logins count per username and client address together (one attacker cannot lock
# a user out everywhere); a lockout ends COOLOFF minutes after the pair's last try, and a
# successful login forgets the pair's failures. Attempts are rows in the database
# (axes_accessattempt); `manage.py axes_reset` (and the admin) clear them.
AXES_FAILURE_LIMIT = int(_positive("DELAYPAY_LOGIN_FAILURE_LIMIT", env.int("DELAYPAY_LOGIN_FAILURE_LIMIT", default=5)))
AXES_COOLOFF_TIME = timedelta(
    minutes=_positive("DELAYPAY_LOGIN_COOLOFF_MINUTES", env.float("DELAYPAY_LOGIN_COOLOFF_MINUTES", default=15.0))
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
# The client address as the API's throttles see it (DELAYPAY_NUM_PROXIES below).
AXES_CLIENT_IP_CALLABLE = "delaypay.client_address.client_address"
AXES_RESET_ON_SUCCESS = True
# No row per successful login (Django's last_login says when a user last logged in).
AXES_DISABLE_ACCESS_LOG = True
# No "AXES: BEGIN" line at the start of every process (some read their first line).
AXES_VERBOSE = False

# --- REST framework -------------------------------------------------------------------

# Request bodies above this are refused with 413 before they are parsed.
DELAYPAY_MAX_BODY_BYTES = 64 * 1024


def _throttle_rate(name: str, default: str) -> str | None:
    """A DRF rate such as ``20/min``; ``off`` disables the throttle."""
    value = env(name, default=default).strip()
    return None if value.lower() in ("", "off", "none") else value


# API tokens (django-rest-knox): a token is valid for this many hours after it is issued,
# never renewed; `POST /auth/token` again for a new one.
DELAYPAY_TOKEN_TTL_HOURS = _positive("DELAYPAY_TOKEN_TTL_HOURS", env.float("DELAYPAY_TOKEN_TTL_HOURS", default=24.0))
REST_KNOX = {
    "TOKEN_TTL": timedelta(hours=DELAYPAY_TOKEN_TTL_HOURS),
    "AUTH_HEADER_PREFIX": "Token",
    "AUTO_REFRESH": False,
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    # A body is JSON only when its Content-Type says application/json (no */*).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "api.parsers.StrictContentNegotiation",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    # Per client address for the token endpoint, per user for every create endpoint.
    "DEFAULT_THROTTLE_RATES": {
        "token": _throttle_rate("DELAYPAY_THROTTLE_TOKEN", "20/min"),
        "create": _throttle_rate("DELAYPAY_THROTTLE_CREATE", "120/min"),
    },
    # Proxies in front of the web process whose X-Forwarded-For entries are trusted for
    # the client address; 0 uses the socket's address (a client cannot spoof it).
    "NUM_PROXIES": env.int("DELAYPAY_NUM_PROXIES", default=0),
}

SPECTACULAR_SETTINGS = {
    "TITLE": "delaypay API",
    "DESCRIPTION": (
        "Schedule transfers of whole currency units between accounts at a future time. "
        "Every error has the shape {\"code\", \"detail\", ...}; see the Error schema. That includes "
        "what the HTTP server refuses before any operation runs, on every path: 400 bad_request (a "
        "malformed request line, header or chunk), 414 uri_too_long, 417 expectation_failed, 431 "
        "header_too_large, 501 not_implemented (a Transfer-Encoding other than chunked); 414 and 431 are "
        "listed on every operation."
    ),
    "VERSION": delaypay.__version__,  # the release (delaypay/__init__.py, CHANGELOG.md)
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "PaymentStatusEnum": "payments.models.PaymentStatus",
        "AccountStatusEnum": "ledger.models.Account.Status",
        "AccountKindEnum": "ledger.models.Account.Kind",
        "AttemptOutcomeEnum": "payments.models.ExecutionAttempt.Outcome",
        "ErrorCodeEnum": "api.errors.ERROR_CODE_CHOICES",
        "RecurringStatusEnum": "payments.models.RecurringStatus",
        "ErrorStatusEnum": "api.schema.ERROR_STATUS_CHOICES",
        "WebhookEventTypeEnum": "api.webhook_serializers.EVENT_TYPE_CHOICES",
        "WebhookDeliveryStatusEnum": "webhooks.models.DeliveryStatus",
    },
    # After the enums (drf-spectacular's default hook): the HTTP server's 414 and 431 on every
    # operation, and the links from each create's answer to the operations on what it made.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "delaypay.openapi.server_responses",
        "api.schema.add_links",
    ],
    "PATH_CONVERTER_OVERRIDES": {"public_id": {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}},
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Redis: Celery's transport and the throttle cache, never truth -----------------

# A plain redis:// URL, or kombu's Sentinel form (sentinel://host:port/db;sentinel://...),
# whose master is found by name: every Redis client of the product (Celery, the cache,
# common/broker.py's probes and queue reads) is built from it by common/redis_url.py.
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
DELAYPAY_REDIS_SENTINEL_MASTER = env("DELAYPAY_REDIS_SENTINEL_MASTER", default="delaypay")
DELAYPAY_REDIS_SENTINEL_PASSWORD = env("DELAYPAY_REDIS_SENTINEL_PASSWORD", default="")
DELAYPAY_CACHE_URL = env("DELAYPAY_CACHE_URL", default=REDIS_URL)
for _name, _url in (("REDIS_URL", REDIS_URL), ("DELAYPAY_CACHE_URL", DELAYPAY_CACHE_URL)):
    try:
        if redis_url.parse_sentinel_url(_url) and not DELAYPAY_REDIS_SENTINEL_MASTER:
            raise ValueError("a Sentinel URL needs DELAYPAY_REDIS_SENTINEL_MASTER, the master's name")
    except ValueError as exc:
        raise ImproperlyConfigured(f"{_name}: {exc}") from None
CELERY_BROKER_URL = REDIS_URL

# Throttle counters live here, shared by every web process (a per-process memory cache
# would multiply every rate by the number of processes).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "KEY_PREFIX": "delaypay",
        **redis_url.cache_settings(
            DELAYPAY_CACHE_URL,
            master_name=DELAYPAY_REDIS_SENTINEL_MASTER,
            sentinel_password=DELAYPAY_REDIS_SENTINEL_PASSWORD,
            options={"socket_connect_timeout": 1, "socket_timeout": 1},
        ),
    }
}

# --- Celery ----------------------------------------------------------------------------

CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# Acknowledge after the batch committed; a worker that dies mid-batch gets its message
# redelivered (and the attempt fence makes the redelivery harmless).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "execute"
CELERY_TASK_ROUTES = {
    "payments.tasks.promoter_tick": {"queue": "promoter"},
    "payments.tasks.execute_batch": {"queue": "execute"},
    # Rail calls wait on an outside gateway: their own queue and process (Procfile ``payouts``).
    "payments.tasks.execute_payouts": {"queue": "payouts"},
    # HTTP waits on receivers never hold the promoter's tick or the payment workers.
    "webhooks.tasks.dispatch": {"queue": "webhooks"},
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# With a Sentinel REDIS_URL, kombu's "sentinel" transport: the master's name and the
# sentinels' connection options (these timeouts, the password) are added.
CELERY_BROKER_TRANSPORT_OPTIONS = redis_url.broker_transport_options(
    REDIS_URL,
    master_name=DELAYPAY_REDIS_SENTINEL_MASTER,
    sentinel_password=DELAYPAY_REDIS_SENTINEL_PASSWORD,
    options={
        # Above the worst batch time by a wide margin; a message whose worker vanished
        # comes back after this, by when the lease has long expired and it is stale.
        "visibility_timeout": env.int("DELAYPAY_VISIBILITY_TIMEOUT", default=600),
        # Publishing must fail fast when Redis is down, not hang the promoter's tick.
        "max_retries": 2,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
        "socket_timeout": 5,
        "socket_connect_timeout": 2,
    },
)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
# Celery's Django fixup closes the database connection around every task unless this
# is set; reconnecting per batch costs more than the batch. See delaypay/celery.py.
CELERY_DB_REUSE_MAX = env.int("DELAYPAY_DB_REUSE_MAX", default=1000)

PROMOTER_TICK_SECONDS = env.float("DELAYPAY_TICK_SECONDS", default=1.0)
# Claim shards (payments/promoter.py, Shard): each period the beat sends one tick per
# shard, each claiming the due rows whose id hashes to it, so that several `promoter`
# processes claim side by side. 1: one tick claims everything.
DELAYPAY_CLAIM_SHARDS = env.int("DELAYPAY_CLAIM_SHARDS", default=1)
if not 1 <= DELAYPAY_CLAIM_SHARDS <= 64:
    raise ImproperlyConfigured("DELAYPAY_CLAIM_SHARDS must be between 1 and 64")
# The process heartbeats (payments.tasks.process_heartbeat): sent every PROCESS_HEARTBEAT_SECONDS;
# the dashboard calls a process type stale when its newest is older than PROCESS_STALE_SECONDS
# (four periods: dead, or its queue that far behind).
PROCESS_HEARTBEAT_SECONDS = 15.0
PROCESS_STALE_SECONDS = 60.0
CELERY_BEAT_SCHEDULE = {
    ("promoter-tick" if shard == 0 else f"promoter-tick-shard-{shard}"): {
        "task": "payments.tasks.promoter_tick",
        "schedule": PROMOTER_TICK_SECONDS,
        "kwargs": {"shard": shard, "shards": DELAYPAY_CLAIM_SHARDS},
        # A tick that waited longer than one period is worthless: drop it.
        "options": {"queue": "promoter", "expires": PROMOTER_TICK_SECONDS},
    }
    for shard in range(DELAYPAY_CLAIM_SHARDS)
} | {
    # Webhooks (webhooks/dispatcher.py): fan out new events and deliver what is due.
    "webhooks-dispatch": {
        "task": "webhooks.tasks.dispatch",
        "schedule": PROMOTER_TICK_SECONDS,
        "options": {"queue": "webhooks", "expires": PROMOTER_TICK_SECONDS},
    },
    # Liveness of the processes whose work writes no heartbeat (the dashboard's Processes
    # panel, console/dashboard.py): each takes one message from its queue and
    # writes the heartbeat process:<type>. Dropped when not taken within the panel's
    # staleness limit, so a dead process does not find a pile of them on its restart.
    **{
        f"heartbeat-{process}": {
            "task": "payments.tasks.process_heartbeat",
            "schedule": PROCESS_HEARTBEAT_SECONDS,
            "args": [process],
            "options": {"queue": queue, "expires": PROCESS_STALE_SECONDS},
        }
        for process, queue in (("worker", "execute"), ("payouts", "payouts"), ("webhooks", "webhooks"))
    },
    # Daily invariant check; logs ERROR per violated check. On the execute queue, never
    # the promoter's: a long reconcile must not delay a tick.
    # Daily settlement reconciliation of yesterday (UTC) against each rail's report
    # (payouts/settlement.py), after the previous day's follow-up lookups are over.
    "reconcile-settlement-daily": {
        "task": "payments.tasks.reconcile_settlement_daily",
        "schedule": crontab(hour=env.int("DELAYPAY_SETTLEMENT_HOUR", default=2), minute=7),
        "options": {"queue": "execute", "expires": 3600},
    },
    # The executor's start markers of attempts that ended (payments/execution.py): on the
    # execute queue, a short DELETE a minute.
    "purge-start-markers": {
        "task": "payments.tasks.purge_start_markers",
        "schedule": 60.0,
        "options": {"queue": "execute", "expires": 60},
    },
    # Idempotency-Key records past their 24 hours (payments/idempotency.py), in batches of
    # 10,000 rows: the table stays about a day of creates, with no cron to set up.
    "purge-idempotency-keys": {
        "task": "payments.tasks.purge_idempotency_keys",
        "schedule": 3600.0,
        "options": {"queue": "execute", "expires": 3600},
    },
    # API tokens past their lifetime (api/tokens.py), of users who never sign in
    # again: issuing a token deletes only its own user's.
    "purge-expired-tokens": {
        "task": "payments.tasks.purge_expired_tokens",
        "schedule": 3600.0,
        "options": {"queue": "execute", "expires": 3600},
    },
    # The schedule's partitions (payments/partitions.py): next months' made ahead, hourly;
    # months past DELAYPAY_RETENTION_DAYS archived, daily (a no-op while it is unset).
    "ensure-partitions": {
        "task": "payments.tasks.ensure_partitions",
        "schedule": 3600.0,
        "options": {"queue": "execute", "expires": 3600},
    },
    "archive-partitions": {
        "task": "payments.tasks.archive_partitions",
        "schedule": crontab(hour=env.int("DELAYPAY_ARCHIVE_HOUR", default=4), minute=37),
        "options": {"queue": "execute", "expires": 3600},
    },
    "reconcile-daily": {
        "task": "payments.tasks.reconcile_daily",
        "schedule": crontab(hour=env.int("DELAYPAY_RECONCILE_HOUR", default=3), minute=17),
        "options": {"queue": "execute", "expires": 3600},
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = env("DELAYPAY_BEAT_SCHEDULE_FILE", default=str(BASE_DIR / "celerybeat-schedule"))

# --- delaypay knobs (tune by measurement; see docs/reference/configuration.md) ------------------

# 1000: measured against 500 and 2000 (docs/explanation/performance.md, "The batch size").
DELAYPAY_CLAIM_BATCH = env.int("DELAYPAY_CLAIM_BATCH", default=1000)
DELAYPAY_LEASE_SECONDS = env.float("DELAYPAY_LEASE_SECONDS", default=60.0)
DELAYPAY_PROMOTER_BUDGET_SECONDS = env.float("DELAYPAY_PROMOTER_BUDGET_SECONDS", default=0.8)
DELAYPAY_INFLIGHT_CAP = env.int("DELAYPAY_INFLIGHT_CAP", default=50_000)
# The retry ladder for errors (seed 001): delays in seconds before retry 1, 2, ..., each
# drawn with full jitter (uniform in [0, delay]); its length is the retry budget.
DELAYPAY_RETRY_DELAYS = [
    float(d) for d in env.list("DELAYPAY_RETRY_DELAYS", default=["60", "300", "1800", "7200", "43200"])
]
# Worker starts a payment gets before it is parked in NEEDS_REVIEW: the first try and
# one per retry of the ladder. Claims whose message no worker started do not count.
DELAYPAY_MAX_ATTEMPTS = env.int("DELAYPAY_MAX_ATTEMPTS", default=1 + len(DELAYPAY_RETRY_DELAYS))
DELAYPAY_MAX_AMOUNT = env.int("DELAYPAY_MAX_AMOUNT", default=10**12)
# Staff deposits above this many units need a second staff member's approval (four
# eyes, ledger.approve_deposit); at or below it they post at once, unless into the
# depositor's own account, or unless the depositor's (or the beneficiary's) deposits made
# without a second person in the last DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS would pass
# it (ledger/services.py, deposit_approval_why). 0: every deposit.
DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD = env.int("DELAYPAY_DEPOSIT_APPROVAL_THRESHOLD", default=10_000)
DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS = env.int("DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS", default=24)
if not 1 <= DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS <= 24 * 366:
    raise ImproperlyConfigured("DELAYPAY_DEPOSIT_APPROVAL_WINDOW_HOURS must be between 1 and 8784")
DELAYPAY_MAX_SCHEDULE_DAYS = env.int("DELAYPAY_MAX_SCHEDULE_DAYS", default=365)
DELAYPAY_TRANSIENT_RETRIES = env.int("DELAYPAY_TRANSIENT_RETRIES", default=5)
DELAYPAY_MIN_RECURRING_INTERVAL = env.int("DELAYPAY_MIN_RECURRING_INTERVAL", default=60)


def _per_user_cap(name: str, default: int) -> int:
    """A per-user limit (payments/limits.py): a whole number, ``0`` or ``off`` for none."""
    value = env(name, default=str(default)).strip().lower()
    if value in ("", "off", "none"):
        return 0
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number of 0 or more, or off (got {value!r})")
    return int(value)


# Per-user limits, checked when a user schedules or changes (payments/limits.py and
# docs/reference/configuration.md): pending one-off payments, active or paused recurring
# payments, and units due on one UTC day.
DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER = _per_user_cap("DELAYPAY_MAX_PENDING_PAYMENTS_PER_USER", 10_000)
DELAYPAY_MAX_ACTIVE_SERIES_PER_USER = _per_user_cap("DELAYPAY_MAX_ACTIVE_SERIES_PER_USER", 100)
DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = _per_user_cap("DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER", 10**15)
# Per-sender fairness of the internal claim (payments/promoter.py, FairWalk): one sender's
# payments take at most this many places in a claim while other senders' payments are due
# (clamped to half the claim batch); with nobody else waiting it still gets the whole
# batch. A whole number, 0 or off: plain due order.
DELAYPAY_CLAIM_PER_SENDER = _per_user_cap("DELAYPAY_CLAIM_PER_SENDER", 50)

# Degraded mode (payments/fallback.py): a promoter that has run no beat tick for AFTER
# seconds while Redis does not answer ticks on its own timer and executes what it claims
# in-process, at most BATCHES_PER_TICK claim batches a tick, one promoter of the fleet
# at a time (a PostgreSQL advisory lock). ENABLED=0 turns the fallback off.
# Release at the instant (payments/release.py): between the ticks, one promoter's thread
# claims what falls due at its due instant. Rows falling due within one slot leave
# together; a payment created already due waits at most the poll interval. Off: only the
# ticks claim, up to DELAYPAY_TICK_SECONDS late.
DELAYPAY_RELEASE_ENABLED = env.bool("DELAYPAY_RELEASE_ENABLED", default=True)
DELAYPAY_RELEASE_SLOT_SECONDS = env.float("DELAYPAY_RELEASE_SLOT_SECONDS", default=0.01)
DELAYPAY_RELEASE_POLL_SECONDS = env.float("DELAYPAY_RELEASE_POLL_SECONDS", default=0.05)
if not 0 < DELAYPAY_RELEASE_SLOT_SECONDS <= DELAYPAY_RELEASE_POLL_SECONDS <= PROMOTER_TICK_SECONDS:
    raise ImproperlyConfigured(
        "DELAYPAY_RELEASE_SLOT_SECONDS must be above 0 and at most DELAYPAY_RELEASE_POLL_SECONDS, "
        "itself at most DELAYPAY_TICK_SECONDS"
    )
DELAYPAY_FALLBACK_ENABLED = env.bool("DELAYPAY_FALLBACK_ENABLED", default=True)
DELAYPAY_FALLBACK_AFTER_SECONDS = env.float("DELAYPAY_FALLBACK_AFTER_SECONDS", default=5.0)
DELAYPAY_FALLBACK_BATCHES_PER_TICK = env.int("DELAYPAY_FALLBACK_BATCHES_PER_TICK", default=4)

# Webhooks (webhooks/, docs/reference/configuration.md): plain http and private addresses
# only for the hosts listed here (or when DEBUG); HTTP timeout per try; an endpoint failing
# for DISABLE_AFTER_DAYS without a success is disabled. Each dispatch claims FANOUT_BATCH
# events and DELIVERY_BATCH due deliveries (leased for LEASE_SECONDS, delivered by
# DELIVERY_THREADS at once) and goes on for BUDGET_SECONDS while work remains; when none
# does, it looks again every POLL_SECONDS until beat's next tick (0: not at all; decision
# 0018). The ladder is the wait before retry 1, 2, ... (2.9 days in all), each +-20 % jitter.
DELAYPAY_WEBHOOK_ALLOW_HOSTS = [h.strip().lower() for h in env.list("DELAYPAY_WEBHOOK_ALLOW_HOSTS", default=[])]
DELAYPAY_WEBHOOK_TIMEOUT_SECONDS = env.float("DELAYPAY_WEBHOOK_TIMEOUT_SECONDS", default=10.0)
DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS = env.float("DELAYPAY_WEBHOOK_DISABLE_AFTER_DAYS", default=5.0)
DELAYPAY_WEBHOOK_FANOUT_BATCH = env.int("DELAYPAY_WEBHOOK_FANOUT_BATCH", default=500)
DELAYPAY_WEBHOOK_DELIVERY_BATCH = env.int("DELAYPAY_WEBHOOK_DELIVERY_BATCH", default=64)
DELAYPAY_WEBHOOK_DELIVERY_THREADS = env.int("DELAYPAY_WEBHOOK_DELIVERY_THREADS", default=16)
DELAYPAY_WEBHOOK_LEASE_SECONDS = env.float("DELAYPAY_WEBHOOK_LEASE_SECONDS", default=120.0)
DELAYPAY_WEBHOOK_BUDGET_SECONDS = env.float("DELAYPAY_WEBHOOK_BUDGET_SECONDS", default=5.0)
DELAYPAY_WEBHOOK_POLL_SECONDS = env.float("DELAYPAY_WEBHOOK_POLL_SECONDS", default=0.05)
if not 0 <= DELAYPAY_WEBHOOK_POLL_SECONDS <= 60:
    raise ImproperlyConfigured("DELAYPAY_WEBHOOK_POLL_SECONDS must be between 0 and 60")
_WEBHOOK_LADDER = ["5", "300", "1800", "7200", "18000", "36000", "36000", "50400", "50400", "50400"]
DELAYPAY_WEBHOOK_RETRY_DELAYS = [float(d) for d in env.list("DELAYPAY_WEBHOOK_RETRY_DELAYS", default=_WEBHOOK_LADDER)]

# Payment rails (payouts to external payees; rails/, docs/reference/payouts.md). The
# sandbox rail's gateway (the Procfile's ``gateway``) and its API key (sent as a Bearer
# token when set); each call's timeout and the connections kept per process. Ambiguous
# outcomes (a timeout, a 5xx) are looked up by key after FOLLOWUP_DELAYS (one step per
# try, full jitter). The breaker opens after BREAKER_FAILURES consecutive failures, or at
# BREAKER_ERROR_RATE of at least BREAKER_MIN_CALLS calls in a BREAKER_WINDOW_SECONDS
# window; it half-opens after BREAKER_COOLDOWN_SECONDS and lets BREAKER_PROBES payouts
# through. RATE_LIMIT paces submissions per rail, fleet-wide (payouts per second).
# A rail's URL must be https:// on a public address (rails/addresses.py), except for the
# hosts in RAIL_ALLOW_HOSTS (by default the sandbox gateway's loopback) or when DEBUG.
DELAYPAY_RAIL_SANDBOX_URL = env("DELAYPAY_RAIL_SANDBOX_URL", default="http://127.0.0.1:8090")
DELAYPAY_RAIL_ALLOW_HOSTS = [
    h.strip().lower() for h in env.list("DELAYPAY_RAIL_ALLOW_HOSTS", default=["127.0.0.1", "localhost"])
]
DELAYPAY_RAIL_SANDBOX_API_KEY = env("DELAYPAY_RAIL_SANDBOX_API_KEY", default="")
DELAYPAY_RAIL_TIMEOUT_SECONDS = env.float("DELAYPAY_RAIL_TIMEOUT_SECONDS", default=5.0)
DELAYPAY_RAIL_CONNECTIONS = env.int("DELAYPAY_RAIL_CONNECTIONS", default=64)
DELAYPAY_RAIL_CONCURRENCY = env.int("DELAYPAY_RAIL_CONCURRENCY", default=16)
DELAYPAY_RAIL_RATE_LIMIT = env.float("DELAYPAY_RAIL_RATE_LIMIT", default=1000.0)
DELAYPAY_RAIL_CLAIM_BATCH = env.int("DELAYPAY_RAIL_CLAIM_BATCH", default=200)
DELAYPAY_RAIL_FOLLOWUP_DELAYS = [
    float(d) for d in env.list("DELAYPAY_RAIL_FOLLOWUP_DELAYS", default=["2", "10", "60", "300", "1800"])
]
DELAYPAY_RAIL_BREAKER_FAILURES = env.int("DELAYPAY_RAIL_BREAKER_FAILURES", default=5)
DELAYPAY_RAIL_BREAKER_ERROR_RATE = env.float("DELAYPAY_RAIL_BREAKER_ERROR_RATE", default=0.5)
DELAYPAY_RAIL_BREAKER_MIN_CALLS = env.int("DELAYPAY_RAIL_BREAKER_MIN_CALLS", default=20)
DELAYPAY_RAIL_BREAKER_WINDOW_SECONDS = env.float("DELAYPAY_RAIL_BREAKER_WINDOW_SECONDS", default=30.0)
DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS = env.float("DELAYPAY_RAIL_BREAKER_COOLDOWN_SECONDS", default=10.0)
DELAYPAY_RAIL_BREAKER_PROBES = env.int("DELAYPAY_RAIL_BREAKER_PROBES", default=1)

# --- Operations: metrics, readiness, logs (docs/reference/operations.md) --------------------

# Multiprocess mode for prometheus_client: every process of a host writes its metrics to
# files here and /metrics on that host sums them. prometheus_client reads the variable
# when it is first imported, which is after settings; a relative path is made absolute
# (against the project) and written back so child processes agree on it.
PROMETHEUS_MULTIPROC_DIR = env("PROMETHEUS_MULTIPROC_DIR", default="")
if PROMETHEUS_MULTIPROC_DIR:
    PROMETHEUS_MULTIPROC_DIR = str((BASE_DIR / PROMETHEUS_MULTIPROC_DIR).resolve())
    Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = PROMETHEUS_MULTIPROC_DIR
# When set, GET /metrics requires "Authorization: Bearer <token>".
DELAYPAY_METRICS_TOKEN = env("DELAYPAY_METRICS_TOKEN", default="")
# Exact counts per status scan the table: computed at most this often per web process.
DELAYPAY_METRICS_CACHE_SECONDS = env.float("DELAYPAY_METRICS_CACHE_SECONDS", default=5.0)
# The worker processes the fleet needs now (delaypay_workers_needed, payments/scaling.py),
# for an autoscaler (deploy/kubernetes/): the payments falling due within the next
# INFLOW_WINDOW_SECONDS per second, plus the backlog already due drained within
# DRAIN_SECONDS, over what one worker process applies (PROCESS_RATE payments/s at full
# batches, unless this host's own batches measured it) at TARGET_UTILIZATION, kept
# between MIN_WORKERS and MAX_WORKERS.
DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS = _positive(
    "DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS", env.float("DELAYPAY_SCALE_INFLOW_WINDOW_SECONDS", default=120.0)
)
DELAYPAY_SCALE_DRAIN_SECONDS = _positive(
    "DELAYPAY_SCALE_DRAIN_SECONDS", env.float("DELAYPAY_SCALE_DRAIN_SECONDS", default=60.0)
)
DELAYPAY_SCALE_PROCESS_RATE = _positive(
    "DELAYPAY_SCALE_PROCESS_RATE", env.float("DELAYPAY_SCALE_PROCESS_RATE", default=2000.0)
)
DELAYPAY_SCALE_TARGET_UTILIZATION = env.float("DELAYPAY_SCALE_TARGET_UTILIZATION", default=0.7)
if not 0 < DELAYPAY_SCALE_TARGET_UTILIZATION <= 1:
    raise ImproperlyConfigured("DELAYPAY_SCALE_TARGET_UTILIZATION must be above 0 and at most 1")
DELAYPAY_SCALE_MIN_WORKERS = env.int("DELAYPAY_SCALE_MIN_WORKERS", default=1)
DELAYPAY_SCALE_MAX_WORKERS = env.int("DELAYPAY_SCALE_MAX_WORKERS", default=64)
if not 0 <= DELAYPAY_SCALE_MIN_WORKERS <= DELAYPAY_SCALE_MAX_WORKERS or DELAYPAY_SCALE_MAX_WORKERS < 1:
    raise ImproperlyConfigured(
        "DELAYPAY_SCALE_MIN_WORKERS must be at least 0 and at most DELAYPAY_SCALE_MAX_WORKERS, which is at least 1"
    )
# /readyz: a promoter tick older than this fails the "promoter" check. With REQUIRE off
# the check is still reported but no longer makes /readyz 503 (every web node fails it at
# once, so a load balancer using /readyz would drop them all for a promoter problem).
DELAYPAY_READY_MAX_TICK_AGE_SECONDS = env.float("DELAYPAY_READY_MAX_TICK_AGE_SECONDS", default=10.0)
DELAYPAY_READY_REQUIRE_PROMOTER = env.bool("DELAYPAY_READY_REQUIRE_PROMOTER", default=True)
# Reconciliation (manage.py reconcile and the daily task): how long a lease may stay
# expired, and a SCHEDULED payment overdue, before it is a violation.
# The schedule's partitions and archival (payments/partitions.py, docs/reference/operations.md).
DELAYPAY_PARTITIONS_AHEAD_MONTHS = env.int("DELAYPAY_PARTITIONS_AHEAD_MONTHS", default=3)
if not 1 <= DELAYPAY_PARTITIONS_AHEAD_MONTHS <= 24:
    raise ImproperlyConfigured("DELAYPAY_PARTITIONS_AHEAD_MONTHS must be between 1 and 24")
# 0 (the default): keep every payment. Otherwise a month whose payments all finished more
# than this many days ago is exported to DELAYPAY_ARCHIVE_DIR and leaves the database.
DELAYPAY_RETENTION_DAYS = env.int("DELAYPAY_RETENTION_DAYS", default=0)
if DELAYPAY_RETENTION_DAYS < 0 or 0 < DELAYPAY_RETENTION_DAYS < 30:
    raise ImproperlyConfigured("DELAYPAY_RETENTION_DAYS must be 0 (keep everything) or at least 30")
DELAYPAY_ARCHIVE_DIR = env("DELAYPAY_ARCHIVE_DIR", default=str(BASE_DIR / "var" / "archive"))

DELAYPAY_RECONCILE_STUCK_SECONDS = env.float("DELAYPAY_RECONCILE_STUCK_SECONDS", default=300.0)
DELAYPAY_RECONCILE_OVERDUE_SECONDS = env.float("DELAYPAY_RECONCILE_OVERDUE_SECONDS", default=300.0)
# A payout's funds reserved longer than this (its whole budget of tries and follow-ups fits
# well within it) is a violation unless it is parked for review.
DELAYPAY_RECONCILE_PENDING_SECONDS = env.float("DELAYPAY_RECONCILE_PENDING_SECONDS", default=3600.0)

# --- Logging: never log secrets or request bodies -------------------------------------

LOG_LEVEL = env("DELAYPAY_LOG_LEVEL", default="INFO")
# "json" (one object per line) unless DEBUG, where "text" is easier to read.
LOG_FORMAT = env("DELAYPAY_LOG_FORMAT", default="text" if DEBUG else "json")
LOGGING = logging_config(level=LOG_LEVEL, fmt=LOG_FORMAT)
