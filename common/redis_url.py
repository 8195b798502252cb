"""Redis URLs, plain or behind Sentinel: the one place that turns ``REDIS_URL`` (or
``DELAYPAY_CACHE_URL``) into a redis-py client, Celery's transport options and Django's
cache settings.

A plain URL (``redis://``, ``rediss://``, ``unix://``) is used as it always was. A Sentinel
URL is kombu's form, one ``sentinel://`` part per sentinel, joined by ``;``::

    sentinel://[[user]:password@]host[:port][/db];sentinel://host[:port][/db];...

The sentinels are asked for the address of the master named ``master_name``
(``DELAYPAY_REDIS_SENTINEL_MASTER``); the password and database of the first part are the
master's, as kombu reads them. ``sentinel_password`` (``DELAYPAY_REDIS_SENTINEL_PASSWORD``)
is the sentinels' own, when they require one. Every client here asks the sentinels again
whenever it opens a connection, so after a failover its next connection goes to the new
master.

No Django here: delaypay/settings.py calls it, and the tests call it directly.
"""

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_SCHEME = "sentinel"
SENTINEL_DEFAULT_PORT = 26379
# Connection options that also apply to the connections to the sentinels themselves: a
# probe's half-second timeouts and single try must not wait on a sentinel any longer.
_SENTINEL_CONNECTION_OPTIONS = ("socket_timeout", "socket_connect_timeout", "retry")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed Sentinel URL: where the sentinels are, and the master's database and
    credentials."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None

    def master_options(self) -> dict:
        """Connection options for the master (redis-py's names)."""
        options: dict = {"db": self.db}
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(f"{SENTINEL_SCHEME}://")


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The sentinels, database and credentials of a Sentinel URL; None for any other URL.
    ValueError for a Sentinel URL that is malformed (a part of another scheme, no host, a
    database that is not a number, a query string, which kombu and we would both ignore)."""
    if not is_sentinel(url):
        return None
    parts = [part.strip() for part in url.split(";") if part.strip()]
    sentinels = []
    for part in parts:
        split = urlsplit(part)
        if split.scheme.lower() != SENTINEL_SCHEME:
            raise ValueError(f"every part of a Sentinel URL starts with sentinel://, not {split.scheme}://")
        if not split.hostname:
            raise ValueError("a part of the Sentinel URL has no host")
        if split.query or split.fragment:
            raise ValueError("a Sentinel URL takes no query string or fragment")
        try:
            port = split.port or SENTINEL_DEFAULT_PORT
        except ValueError:
            raise ValueError("a part of the Sentinel URL has a port that is not a number") from None
        sentinels.append((split.hostname, port))
    first = urlsplit(parts[0])
    db_text = first.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"the Sentinel URL's database must be a number, not {db_text!r}")
    return SentinelURL(
        sentinels=tuple(sentinels),
        db=int(db_text),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def sentinel_options(options: dict, sentinel_password: str | None) -> dict:
    """redis-py's ``sentinel_kwargs``: the timeouts (and retry policy) of ``options``, and
    the sentinels' password. Given explicitly because redis-py, when given none, copies
    only the ``socket_*`` options, and never a password."""
    chosen = {key: options[key] for key in _SENTINEL_CONNECTION_OPTIONS if key in options}
    if sentinel_password:
        chosen["password"] = sentinel_password
    return chosen


def client(url: str, *, master_name: str, sentinel_password: str | None = None, **options) -> redis.Redis:
    """A redis-py client for ``url``: ``redis.Redis.from_url`` for a plain URL; for a
    Sentinel URL, a client of the master named ``master_name`` that asks the sentinels for
    its address at every new connection. ``options`` are redis-py connection options (the
    timeouts and retry policy apply to the sentinels too)."""
    parsed = parse_sentinel_url(url)
    if parsed is None:
        return redis.Redis.from_url(url, **options)
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_options(options, sentinel_password))
    return sentinel.master_for(master_name, **parsed.master_options(), **options)


class SentinelPool(SentinelConnectionPool):
    """The connection pool of Django's ``RedisCache`` for a Sentinel URL
    (``OPTIONS["pool_class"]``, see ``cache_settings``). Django builds its pool with
    ``pool_class.from_url(location, **OPTIONS)``; this one follows the master instead of
    connecting to a fixed address."""

    @classmethod
    def from_url(cls, url: str, *, master_name: str, sentinel_password: str | None = None, **options):
        parsed = parse_sentinel_url(url)
        if parsed is None:
            raise ValueError("SentinelPool needs a sentinel:// URL")
        sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_options(options, sentinel_password))
        return cls(master_name, sentinel, **parsed.master_options(), **options)


def broker_transport_options(url: str, *, master_name: str, sentinel_password: str | None, options: dict) -> dict:
    """Celery's ``broker_transport_options``: ``options`` as they are for a plain URL; for a
    Sentinel URL (kombu's ``sentinel`` transport) with the master's name and the options of
    the connections to the sentinels added."""
    if parse_sentinel_url(url) is None:
        return dict(options)
    return {**options, "master_name": master_name, "sentinel_kwargs": sentinel_options(options, sentinel_password)}


def cache_settings(url: str, *, master_name: str, sentinel_password: str | None, options: dict) -> dict:
    """``LOCATION`` and ``OPTIONS`` of a ``django.core.cache.backends.redis.RedisCache``.
    Django splits a ``LOCATION`` string at ``;`` and ``,`` into a writer and readers, so a
    Sentinel URL goes in as a list of one: the whole set is one server, its master."""
    if parse_sentinel_url(url) is None:
        return {"LOCATION": url, "OPTIONS": dict(options)}
    return {
        "LOCATION": [url],
        "OPTIONS": {
            **options,
            "pool_class": f"{SentinelPool.__module__}.{SentinelPool.__qualname__}",
            "master_name": master_name,
            "sentinel_password": sentinel_password or None,
        },
    }
