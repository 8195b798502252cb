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
