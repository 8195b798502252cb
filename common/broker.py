"""Read-only looks at the Celery broker (Redis): reachability and queue depths. Behind
Sentinel (a sentinel:// REDIS_URL) every look goes to the current master
(common/redis_url.py)."""

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import redis_url

# kombu's Redis transport keeps a queue's priority levels in separate lists named
# "<queue>\x06\x16<priority>" (priority 0 is the bare name); default steps 0, 3, 6, 9.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)
# Messages delivered to a worker and not yet acknowledged (kombu's visibility bookkeeping).
_UNACKED_KEY = "unacked"

_clients: dict[tuple[str, str, str], redis.Redis] = {}


def _client(cache: dict, url: str | None, **options) -> redis.Redis:
    """The client of ``cache`` for ``url`` (default REDIS_URL) and the Sentinel settings,
    built once per process."""
    key = (url or settings.REDIS_URL, settings.DELAYPAY_REDIS_SENTINEL_MASTER,
           settings.DELAYPAY_REDIS_SENTINEL_PASSWORD)
    client = cache.get(key)
    if client is None:
        client = cache[key] = redis_url.client(key[0], master_name=key[1], sentinel_password=key[2], **options)
    return client


def redis_client(url: str | None = None) -> redis.Redis:
    """A client with short timeouts (a probe or a scrape must not hang on a dead Redis)."""
    return _client(_clients, url, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=30)


_probes: dict[tuple[str, str, str], redis.Redis] = {}


def probe_client(url: str | None = None) -> redis.Redis:
    """A client for reachability checks: one try, half-second timeouts, for the sentinels
    as for the master. (redis-py retries a refused connection ten times with backoff by
    default: seconds that a readiness probe or the promoter's once-a-second look cannot
    spend.) CELERY_BROKER_URL is REDIS_URL."""
    return _client(_probes, url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))


def broker_answers(url: str | None = None) -> bool:
    """True when the Celery broker (Redis) answers one PING."""
    try:
        return bool(probe_client(url).ping())
    except (redis.RedisError, OSError):
        return False


def celery_queue_names() -> list[str]:
    """Every queue the tasks are routed to."""
    queues = {settings.CELERY_TASK_DEFAULT_QUEUE}
    queues.update(route["queue"] for route in settings.CELERY_TASK_ROUTES.values() if "queue" in route)
    return sorted(queues)


def queue_lengths() -> dict[str, int]:
    """Messages waiting in each Celery queue (all priority levels)."""
    names = celery_queue_names()
    pipe = redis_client().pipeline(transaction=False)
    for name in names:
        for step in _PRIORITY_STEPS:
            pipe.llen(name if step == 0 else f"{name}{_PRIORITY_SEP}{step}")
    counts = pipe.execute()
    per_queue = len(_PRIORITY_STEPS)
    return {name: sum(counts[i * per_queue:(i + 1) * per_queue]) for i, name in enumerate(names)}


def unacked_count() -> int:
    """Messages taken by workers and not yet acknowledged, across queues."""
    return int(redis_client().hlen(_UNACKED_KEY))
