"""The Celery application: promoter on its own queue, executors on "execute", the webhook
dispatcher on "webhooks" (a thread pool: it waits on receivers). Routes and the beat
schedule are in settings (CELERY_TASK_ROUTES, CELERY_BEAT_SCHEDULE)."""

import functools
import gc
import os

from celery import Celery, bootsteps
from celery.signals import setup_logging, task_prerun, worker_init, worker_process_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "delaypay.settings")

app = Celery("delaypay")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class DegradedModeFallback(bootsteps.StartStopStep):
    """In a promoter (a worker consuming the "promoter" queue) only: tick on its own timer
    and execute from the database while Redis is down (payments/fallback.py). A worker
    step starts before the consumer, so it also runs in a promoter started during an
    outage, whose consumer is still trying to connect."""

    label = "degraded-mode fallback"

    def include_if(self, worker) -> bool:
        from django.conf import settings

        return settings.DELAYPAY_FALLBACK_ENABLED and "promoter" in worker.app.amqp.queues.consume_from

    def create(self, worker):
        from payments.fallback import Fallback

        return Fallback.from_settings()


app.steps["worker"].add(DegradedModeFallback)


class ReleaseAtTheInstant(bootsteps.StartStopStep):
    """In a promoter only: between the beat's ticks, claim what falls due at its due
    instant (payments/release.py). One promoter of the fleet releases at a time."""

    label = "release at the instant"

    def include_if(self, worker) -> bool:
        from django.conf import settings

        return settings.DELAYPAY_RELEASE_ENABLED and "promoter" in worker.app.amqp.queues.consume_from

    def create(self, worker):
        from payments.release import Releaser

        return Releaser.from_settings()


app.steps["worker"].add(ReleaseAtTheInstant)


@task_prerun.connect
def _drop_dead_connections(**_kwargs):
    # The connection is kept between tasks (CELERY_DB_REUSE_MAX); one that died with a
    # PostgreSQL restart is discarded here instead of failing the next batch.
    from django.db import close_old_connections

    close_old_connections()


@worker_process_init.connect
@worker_ready.connect
def _freeze_startup_objects(**_kwargs):
    # A worker process starts with Django, Celery, Kombu and the app in memory: about
    # 100,000 objects the cyclic collector tracks and never frees, and every full
    # collection walked them all again (0.25 s of bench_executor's 0.32 s of collections
    # over 40,000 payments, about 6 us a payment). Frozen, they sit in the permanent
    # generation and a collection walks only what the batches allocate. Sent in each
    # prefork child after the fork (worker_process_init) and in the main process once it
    # is ready (worker_ready: the promoter's solo pool and the webhooks' threads run
    # their tasks there).
    gc.freeze()


@setup_logging.connect
def _use_django_logging(**_kwargs):
    # Connecting this signal stops Celery from installing its own handlers: workers,
    # the promoter and beat log through settings.LOGGING (JSON lines, or text in DEBUG).
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)


@worker_init.connect
def _cut_commands_a_frozen_primary_never_answers(**_kwargs):
    # Every worker process (and each prefork child after the fork) gives up on a command
    # its database has not answered within the deadline (common/db_deadline.py).
    from common import db_deadline, db_failover

    db_deadline.install()
    db_failover.install()  # and counts its reconnects and the primary's changes


@worker_init.connect
def _heartbeats_never_block_the_event_loop(**_kwargs):
    # Celery's worker heartbeat (celery.worker.heartbeat.Heart, every 2 s from the event
    # loop's timer) publishes with retry=True and no retry policy: kombu then retries the
    # connection for ever. When Redis dies, a heartbeat that fires before the consumer has
    # read the broken socket holds the whole event loop in that retry until Redis is back:
    # the consumer never sees the loss, nothing else runs, not even a finished task's ack
    # (tests/e2e/test_broker_restart.py caught it, with the worker's and then the
    # promoter's stack in Heart._send -> retry_over_time). Sent without retry, a heartbeat
    # to a dead Redis fails within the transport's connect options (a second), the error
    # reaches the consumer as a lost connection, and it reconnects as it does otherwise.
    from celery.worker import heartbeat

    send = heartbeat.Heart._send
    if getattr(send, "delaypay_guard", False):
        return

    @functools.wraps(send)
    def _send(self, event, retry=True):
        return send(self, event, retry=False)

    _send.delaypay_guard = True
    heartbeat.Heart._send = _send


@worker_init.connect
def _survive_broker_restarts(**_kwargs):
    # Workaround: with Celery 5.7.0 / kombu 5.7.0 (the newest releases) a worker, or the
    # promoter, exits when Redis restarts while one of its tasks is in flight (acks_late):
    # "Unrecoverable error: AttributeError: 'NoneType' object has no attribute 'hostname'".
    # On a lost connection the consumer calls connection.collect() and then, since
    # celery/celery#10242, connection.close(). collect() stops closing channels at the
    # first that fails (remote control's, which deletes its fanout binding on a Redis that
    # is gone) and detaches the transport (transport.client = None), leaving the task
    # channel open. close() then closes that channel, whose restore of the in-flight
    # message builds a Redis pool from transport.client.hostname: an AttributeError, not a
    # connection error, so the consumer gives up, and the task's late ack fails the same
    # way (as in celery/kombu#582). Turning remote control off avoids it too, but Flower and
    # `celery inspect` need it. Instead, a channel whose connection is gone raises redis'
    # ConnectionError, which kombu and Celery handle as an outage: the close is ignored,
    # the consumer reconnects, the late ack is logged as failed ("Couldn't ack"). Nothing
    # is lost: a restarted Redis forgot the message; one that kept it redelivers it after
    # the visibility timeout, and the attempt fence makes that a no-op.
    # tests/e2e/test_broker_restart.py restarts Redis under such a task.
    # Behind Sentinel the channel is kombu's SentinelChannel, whose pool is built by
    # _sentinel_managed_pool from _connparams and then transport.client.alt: kombu 5.7's
    # inherits Channel's _connparams, so the guard covers it; a release that gives it its
    # own gets the same guard (tests/ops/test_broker_guard.py checks both).
    from kombu.transport import redis as kombu_redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    def guarded(connparams):
        @functools.wraps(connparams)
        def _connparams(channel, *args, **kwargs):
            if channel.connection is None or channel.connection.client is None:
                raise RedisConnectionError("this channel's broker connection was closed")
            return connparams(channel, *args, **kwargs)

        _connparams.delaypay_guard = True
        return _connparams

    for channel_class in (kombu_redis.Channel, kombu_redis.SentinelChannel):
        connparams = vars(channel_class).get("_connparams")
        if connparams is not None and not getattr(connparams, "delaypay_guard", False):
            channel_class._connparams = guarded(connparams)
