"""Read-only looks at the Celery broker (Redis): reachability and queue depths."""

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

# kombu's Redis transport keeps a queue's priority levels in separate lists named
# "<queue>\x06\x16<priority>" (priority 0 is the bare name); default steps 0, 3, 6, 9.
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (0, 3, 6, 9)
# Messages delivered to a worker and not yet acknowledged (kombu's visibility bookkeeping).
_UNACKED_KEY = "unacked"

_clients: dict[str, redis.Redis] = {}


def redis_client(url: str | None = None) -> redis.Redis:
    """A client with short timeouts (a probe or a scrape must not hang on a dead Redis)."""
    url = url or settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(
            url, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=30
        )
    return client


_probes: dict[str, redis.Redis] = {}


def probe_client(url: str | None = None) -> redis.Redis:
    """A client for reachability checks: one try, half-second timeouts. (redis-py retries
    a refused connection ten times with backoff by default: seconds that a readiness probe
    or the promoter's once-a-second look cannot spend.)"""
    url = url or settings.REDIS_URL  # CELERY_BROKER_URL is REDIS_URL
    client = _probes.get(url)
    if client is None:
        client = _probes[url] = redis.Redis.from_url(
            url, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
    return client


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
