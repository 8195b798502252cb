"""common/redis_url.py: a plain Redis URL is used as it always was; a Sentinel URL (kombu's
form) is parsed once and becomes a client of the named master, Celery's transport options
and Django's cache settings, with the sentinels' timeouts and password. Nothing here talks
to a Sentinel: tests/ha/test_redis_sentinel_stack.py runs the product on a real set."""

import time

import pytest
import redis
from django.core.cache.backends.redis import RedisCache
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from common import broker, redis_url
from devtools.sandbox import pick_port

THREE = "sentinel://10.0.0.1:26380/2;sentinel://10.0.0.2/2;sentinel://[::1]:26382/2"


def test_a_plain_url_is_not_a_sentinel_url():
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///run/redis.sock?db=2"):
        assert not redis_url.is_sentinel(url)
        assert redis_url.parse_sentinel_url(url) is None


def test_a_sentinel_url_names_every_sentinel_and_the_masters_database():
    parsed = redis_url.parse_sentinel_url(THREE)
    assert parsed.sentinels == (("10.0.0.1", 26380), ("10.0.0.2", 26379), ("::1", 26382))
    assert (parsed.db, parsed.username, parsed.password) == (2, None, None)
    assert parsed.master_options() == {"db": 2}


def test_the_first_parts_credentials_are_the_masters_as_kombu_reads_them():
    parsed = redis_url.parse_sentinel_url("SENTINEL://app:p%40ss@h1:1/4; sentinel://h2:2/4 ;")
    assert parsed.sentinels == (("h1", 1), ("h2", 2))
    assert parsed.master_options() == {"db": 4, "username": "app", "password": "p@ss"}
    assert redis_url.parse_sentinel_url("sentinel://:secret@h1").master_options() == {"db": 0, "password": "secret"}


@pytest.mark.parametrize(("url", "says"), [
    ("sentinel://h1:1/0;redis://h2:2/0", "every part"),
    ("sentinel:///0", "no host"),
    ("sentinel://h1:port/0", "not a number"),
    ("sentinel://h1:1/zero", "must be a number"),
    ("sentinel://h1:1/0?ssl=true", "no query string"),
])
def test_a_malformed_sentinel_url_is_refused(url, says):
    with pytest.raises(ValueError, match=says):
        redis_url.parse_sentinel_url(url)


def test_the_sentinels_get_the_timeouts_the_retry_policy_and_their_own_password():
    retry = Retry(NoBackoff(), 0)
    options = {"socket_timeout": 0.5, "socket_connect_timeout": 0.25, "retry": retry, "health_check_interval": 30}
    assert redis_url.sentinel_options(options, "") == {"socket_timeout": 0.5, "socket_connect_timeout": 0.25,
                                                        "retry": retry}
    assert redis_url.sentinel_options({}, "s3cret") == {"password": "s3cret"}


def test_a_plain_url_gives_a_plain_client():
    client = redis_url.client("redis://127.0.0.1:6390/7", master_name="ignored", socket_timeout=1.5)
    kwargs = client.connection_pool.connection_kwargs
    assert type(client.connection_pool) is redis.ConnectionPool
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["socket_timeout"]) == ("127.0.0.1", 6390, 7, 1.5)


def test_a_sentinel_url_gives_a_client_of_the_named_master():
    retry = Retry(NoBackoff(), 0)
    client = redis_url.client("sentinel://:pw@h1:1/3;sentinel://h2:2/3", master_name="payments",
                              sentinel_password="spw", socket_timeout=0.5, retry=retry)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.is_master
    assert pool.service_name == "payments"
    assert {k: pool.connection_kwargs[k] for k in ("db", "password", "socket_timeout", "retry")} == {
        "db": 3, "password": "pw", "socket_timeout": 0.5, "retry": retry}
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels] == [("h1", 1), ("h2", 2)]
    first = sentinels[0].connection_pool.connection_kwargs
    assert (first["password"], first["socket_timeout"], first["retry"]) == ("spw", 0.5, retry)


def test_celery_gets_the_sentinel_transport_options_only_for_a_sentinel_url():
    options = {"visibility_timeout": 600, "max_retries": 2, "socket_timeout": 5, "socket_connect_timeout": 2}
    plain = redis_url.broker_transport_options("redis://h/0", master_name="m", sentinel_password="", options=options)
    assert plain == options
    sentinel = redis_url.broker_transport_options(THREE, master_name="m", sentinel_password="spw", options=options)
    assert sentinel == {**options, "master_name": "m",
                        "sentinel_kwargs": {"socket_timeout": 5, "socket_connect_timeout": 2, "password": "spw"}}


def test_the_cache_keeps_a_plain_location_and_gets_one_sentinel_pool_for_a_sentinel_url():
    options = {"socket_timeout": 1, "socket_connect_timeout": 1}
    plain = redis_url.cache_settings("redis://h/0", master_name="m", sentinel_password="", options=options)
    assert plain == {"LOCATION": "redis://h/0", "OPTIONS": options}

    settings = redis_url.cache_settings(THREE, master_name="m", sentinel_password="", options=options)
    cache = RedisCache(settings["LOCATION"], {"OPTIONS": settings["OPTIONS"]})
    pool = cache._cache._get_connection_pool(write=True)
    assert cache._cache._servers == [THREE]  # one server, not three split at ";"
    assert isinstance(pool, redis_url.SentinelPool) and pool.service_name == "m"
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["socket_timeout"]) == (2, 1)
    assert cache._cache._get_connection_pool(write=False) is pool  # reads go to the master too
    with pytest.raises(ValueError, match="sentinel://"):
        redis_url.SentinelPool.from_url("redis://h/0", master_name="m")


def test_a_probe_through_sentinels_that_are_gone_answers_false_at_once(settings):
    ports = [pick_port(56900 + 10 * i) for i in range(3)]  # nothing listens there
    url = ";".join(f"sentinel://127.0.0.1:{port}/0" for port in ports)
    started = time.monotonic()
    assert broker.broker_answers(url) is False
    assert time.monotonic() - started < 1.0
    assert isinstance(broker.probe_client(url).connection_pool, SentinelConnectionPool)
    assert broker.probe_client(url) is broker.probe_client(url)  # built once per process
