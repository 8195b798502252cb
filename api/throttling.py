"""Rate limits on the token and create endpoints (rates: REST_FRAMEWORK
DEFAULT_THROTTLE_RATES, from DELAYPAY_THROTTLE_* in the environment)."""

import logging

from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle

logger = logging.getLogger(__name__)


class ScopedThrottle(ScopedRateThrottle):
    """DRF's ScopedRateThrottle with two changes.

    * Rates are read at request time, so a changed setting applies (DRF copies them
      once, at import).
    * It fails open: when the cache (Redis) is unreachable the request goes through and
      a warning is logged. Redis is never truth here; scheduling a payment must not
      depend on it.
    """

    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError) as exc:
            logger.warning("throttle cache unavailable, not throttling: %s", exc)
            return True

    def wait(self):
        """Seconds until a request would pass; never None, so a 429 always has Retry-After."""
        wait = super().wait()
        if wait is None:  # more history than the current rate allows (the rate was lowered)
            wait = self.duration - (self.now - self.history[-1]) if self.history else self.duration
        return wait


class CreateThrottle(ScopedThrottle):
    """Applies the view's scope to POST only: reads are not rate-limited here."""

    def allow_request(self, request, view):
        if request.method != "POST":
            return True
        return super().allow_request(request, view)
