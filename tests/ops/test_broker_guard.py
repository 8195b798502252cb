"""delaypay/celery.py's ``_survive_broker_restarts``: a kombu Redis channel whose connection
was closed raises redis' ConnectionError (an outage Celery handles) instead of an
AttributeError (which stops the worker), for the plain transport and for the Sentinel one
(kombu's SentinelChannel, used with a sentinel:// REDIS_URL). The processes that follow a
real failover: tests/ha/test_redis_sentinel_stack.py; a real restart:
tests/e2e/test_broker_restart.py."""

from types import SimpleNamespace

import pytest
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from delaypay.celery import _survive_broker_restarts

CHANNELS = (kombu_redis.Channel, kombu_redis.SentinelChannel)


@pytest.fixture
def guarded(monkeypatch):
    """The guard installed as a worker installs it, and taken off again after the test."""
    for channel_class in CHANNELS:
        if "_connparams" in vars(channel_class):
            monkeypatch.setattr(channel_class, "_connparams", vars(channel_class)["_connparams"])
    _survive_broker_restarts()
    _survive_broker_restarts()  # a second worker_init (or a fork) wraps nothing twice


def closed_channel(channel_class, connection):
    channel = channel_class.__new__(channel_class)  # no connection is made
    channel.connection = connection
    return channel


@pytest.mark.parametrize("channel_class", CHANNELS, ids=["redis", "sentinel"])
@pytest.mark.parametrize("connection", [None, SimpleNamespace(client=None)], ids=["no-connection", "detached"])
def test_a_closed_channel_reports_a_connection_error(guarded, channel_class, connection):
    channel = closed_channel(channel_class, connection)
    with pytest.raises(RedisConnectionError, match="connection was closed"):
        channel._connparams()
    assert channel_class._connparams.delaypay_guard
    assert not getattr(channel_class._connparams.__wrapped__, "delaypay_guard", False)


def test_the_sentinel_pool_of_a_closed_channel_is_a_connection_error_too(guarded):
    # _sentinel_managed_pool reads transport.client.alt after _connparams: the guard comes first.
    channel = closed_channel(kombu_redis.SentinelChannel, SimpleNamespace(client=None))
    with pytest.raises(RedisConnectionError):
        channel._sentinel_managed_pool()


# --- _heartbeats_never_block_the_event_loop ------------------------------------------------


def heartbeat_to(url: str):
    """A worker's Heart whose event dispatcher publishes to ``url``, with delaypay's transport
    options (the connect retries of CELERY_BROKER_TRANSPORT_OPTIONS)."""
    from celery.worker.heartbeat import Heart
    from kombu.asynchronous.timer import Timer

    from delaypay.celery import app

    connection = app.connection_for_write(url)
    dispatcher = app.events.Dispatcher(connection, hostname="heart-test@localhost", enabled=True,
                                       buffer_while_offline=False)
    return Heart(Timer(), dispatcher), connection


def send_in_thread(heart, seconds: float) -> tuple[bool, BaseException | None]:
    """(whether _send returned or raised within ``seconds``, what it raised)."""
    import threading

    raised: list[BaseException] = []

    def send():
        try:
            heart._send("worker-heartbeat")
        except BaseException as exc:  # what it raised is the finding
            raised.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), (raised or [None])[0]


def heart_whose_redis_died(tmp_path, name: str):
    """A Heart that sent one heartbeat to a live Redis, which then died (SIGKILL)."""
    from devtools.sandbox import PrivateRedis, pick_port

    redis = PrivateRedis(port=pick_port(56990), directory=tmp_path / name)
    redis.start()
    heart, connection = heartbeat_to(redis.url)
    assert send_in_thread(heart, 10) == (True, None)  # connected and sent
    redis.stop()  # SIGKILL, then its log closed
    return heart, connection


@pytest.mark.processes
def test_a_heartbeat_to_a_dead_redis_fails_at_once_instead_of_holding_the_event_loop(monkeypatch, tmp_path):
    """Celery's Heart publishes with retry=True and no policy: kombu retries the lost
    connection for ever, and the worker's event loop, from whose timer it runs, waits with
    it (the worker then never saw Redis go: tests/e2e/test_broker_restart.py). Guarded, it
    fails within the transport's connect options and the consumer gets the error."""
    from celery.worker import heartbeat

    from delaypay.celery import _heartbeats_never_block_the_event_loop

    monkeypatch.setattr(heartbeat.Heart, "_send", heartbeat.Heart._send)
    unguarded, _ = heart_whose_redis_died(tmp_path, "unguarded")
    returned, _ = send_in_thread(unguarded, 8)
    assert not returned, "unguarded, a heartbeat to a dead Redis should still be retrying"

    _heartbeats_never_block_the_event_loop()
    _heartbeats_never_block_the_event_loop()  # a second worker_init wraps nothing twice
    guarded, connection = heart_whose_redis_died(tmp_path, "guarded")
    returned, raised = send_in_thread(guarded, 8)
    assert returned and raised is not None, raised
    assert isinstance(raised, connection.connection_errors), repr(raised)
