"""delaypay settings: twelve-factor, everything from the environment.

Every variable read here is listed in README.md ("Configuration").
"""

from pathlib import Path

import environ
from celery.schedules import crontab

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
    "rest_framework.authtoken",
    "drf_spectacular",
    "ledger",
    "payments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
DATABASES["default"].setdefault("TEST", {})
if env("DJANGO_TEST_DATABASE_NAME", default=""):
    DATABASES["default"]["TEST"]["NAME"] = env("DJANGO_TEST_DATABASE_NAME")

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

SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- REST framework -------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "payments.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "delaypay API",
    "DESCRIPTION": "Schedule transfers of whole currency units between accounts at a future time.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
}

# --- Celery (Redis is transport, never truth) ------------------------------------------

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
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
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
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
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
# Celery's Django fixup closes the database connection around every task unless this
# is set; reconnecting per batch costs more than the batch. See delaypay/celery.py.
CELERY_DB_REUSE_MAX = env.int("DELAYPAY_DB_REUSE_MAX", default=1000)

PROMOTER_TICK_SECONDS = env.float("DELAYPAY_TICK_SECONDS", default=1.0)
CELERY_BEAT_SCHEDULE = {
    "promoter-tick": {
        "task": "payments.tasks.promoter_tick",
        "schedule": PROMOTER_TICK_SECONDS,
        # A tick that waited longer than one period is worthless: drop it.
        "options": {"queue": "promoter", "expires": PROMOTER_TICK_SECONDS},
    },
    # Daily invariant check; logs ERROR per violated check. On the execute queue, never
    # the promoter's: a long reconcile must not delay a tick.
    "reconcile-daily": {
        "task": "payments.tasks.reconcile_daily",
        "schedule": crontab(hour=env.int("DELAYPAY_RECONCILE_HOUR", default=3), minute=17),
        "options": {"queue": "execute", "expires": 3600},
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = env("DELAYPAY_BEAT_SCHEDULE_FILE", default=str(BASE_DIR / "celerybeat-schedule"))

# --- delaypay knobs (tune by measurement; see README "Configuration") ------------------

DELAYPAY_CLAIM_BATCH = env.int("DELAYPAY_CLAIM_BATCH", default=500)
DELAYPAY_LEASE_SECONDS = env.float("DELAYPAY_LEASE_SECONDS", default=60.0)
DELAYPAY_PROMOTER_BUDGET_SECONDS = env.float("DELAYPAY_PROMOTER_BUDGET_SECONDS", default=0.8)
DELAYPAY_INFLIGHT_CAP = env.int("DELAYPAY_INFLIGHT_CAP", default=50_000)
DELAYPAY_MAX_ATTEMPTS = env.int("DELAYPAY_MAX_ATTEMPTS", default=5)
DELAYPAY_MAX_AMOUNT = env.int("DELAYPAY_MAX_AMOUNT", default=10**12)
DELAYPAY_MAX_SCHEDULE_DAYS = env.int("DELAYPAY_MAX_SCHEDULE_DAYS", default=365)
DELAYPAY_TRANSIENT_RETRIES = env.int("DELAYPAY_TRANSIENT_RETRIES", default=5)
# Reconciliation (manage.py reconcile and the daily task): how long a lease may stay
# expired, and a SCHEDULED payment overdue, before it is a violation.
DELAYPAY_RECONCILE_STUCK_SECONDS = env.float("DELAYPAY_RECONCILE_STUCK_SECONDS", default=300.0)
DELAYPAY_RECONCILE_OVERDUE_SECONDS = env.float("DELAYPAY_RECONCILE_OVERDUE_SECONDS", default=300.0)

# --- Logging: never log secrets or request bodies -------------------------------------

LOG_LEVEL = env("DELAYPAY_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(processName)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "celery": {"level": LOG_LEVEL},
    },
}
