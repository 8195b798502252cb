"""The Celery application: promoter on its own queue, executors on "execute"."""

import os

from celery import Celery
from celery.signals import setup_logging, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "delaypay.settings")

app = Celery("delaypay")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _drop_dead_connections(**_kwargs):
    # The connection is kept between tasks (CELERY_DB_REUSE_MAX); one that died with a
    # PostgreSQL restart is discarded here instead of failing the next batch.
    from django.db import close_old_connections

    close_old_connections()


@setup_logging.connect
def _use_django_logging(**_kwargs):
    # Connecting this signal stops Celery from installing its own handlers: workers,
    # the promoter and beat log through settings.LOGGING (JSON lines, or text in DEBUG).
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
