"""Operational endpoints: liveness, readiness and Prometheus metrics.

Outside the API (no DRF authentication, no throttling): probes and scrapers call them
every few seconds. They are exempt from the HTTPS redirect (SECURE_REDIRECT_EXEMPT).
"""

import functools
import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST

from api.errors import error_body
from api.errors import permission_denied as api_permission_denied
from common import db_deadline, db_failover, prometheus
from console.refusal import refusal_page
from delaypay import health
from payments.collector import ScheduleCollector
from webhooks.metrics import WebhookCollector


def read_only(view):
    """GET and HEAD only; anything else is a JSON 405."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse(error_body("method_not_allowed", f'Method "{request.method}" not allowed.'),
                                    status=405)
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return never_cache(wrapper)


@read_only
def healthz(request):
    """Liveness: the process answers. Touches nothing else, so a database or Redis outage
    never gets healthy processes restarted."""
    return JsonResponse({"status": "ok"})


@read_only
def readyz(request):
    """Readiness: 200 when PostgreSQL answers, migrations are applied and the promoter
    ticked recently; 503 otherwise. The body says which check failed. Redis down is
    200 with the status "degraded" (the promoter executes from the database)."""
    ready, checks = health.readiness()
    return JsonResponse({"status": health.overall_status(ready, checks), "checks": checks},
                        status=200 if ready else 503)


def _authorized(request) -> bool:
    token = settings.DELAYPAY_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


# Counted by the serving processes (common/db_deadline.py, common/db_failover.py);
# imported here so that the series are on /metrics, at 0, before the first event, as the
# alert rules need.
_EXPORTED_FROM_THE_START = (
    db_deadline.commands_cut_total,
    db_failover.connections_opened_total,
    db_failover.primary_changes_total,
)


@read_only
def metrics(request):
    """Prometheus text exposition: every process of this host plus the schedule's state."""
    if not _authorized(request):
        response = JsonResponse(error_body("not_authenticated", "A valid bearer token is required."), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    collector = ScheduleCollector(counts_max_age=settings.DELAYPAY_METRICS_CACHE_SECONDS)
    return HttpResponse(prometheus.render([collector, WebhookCollector()]), content_type=CONTENT_TYPE_LATEST)


def permission_denied(request, exception=None):
    """The 403 handler (urls.py): the console's page under /admin/ (console/refusal.py:
    its header, a way back, the missing permission and who grants it), else the API's."""
    if request.path_info.startswith("/admin/"):
        return refusal_page(request, exception)
    return api_permission_denied(request, exception)
