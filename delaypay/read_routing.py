"""The request side of the read replica (delaypay/db_router.py): which requests may read
from it, read-your-writes, and the fall-back to the primary when it fails mid-request.

Installed (last in MIDDLEWARE, so it wraps the view alone) only when DATABASE_REPLICA_URL
is set.
"""

import logging

from django.db import DatabaseError

from common.routing import REPLICA, current_routing, reset_routing, set_routing
from delaypay.db_router import ReadRouting, record_write, replica_monitor

logger = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD"})  # OPTIONS is 405 on every API view (api/base.py)
API_ROUTE_PREFIX = "api/"
# The API's read views (api/urls.py names) whose GET and HEAD may be served by the
# replica: payment status and lists, account reads, recurring payments and payees. Staff
# views (deposit requests), webhook endpoints and everything outside the API read the primary.
READ_VIEWS = frozenset(
    {
        "payment-list",
        "payment-detail",
        "account-list",
        "account-detail",
        "account-payments",
        "account-transfers",
        "recurring-list",
        "recurring-detail",
        "payee-list",
        "payee-detail",
    }
)


class ReadReplicaMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = set_routing(ReadRouting(request))
        try:
            response = self.get_response(request)
        finally:
            reset_routing(token)
        # Any non-safe API request by a user sends that user's reads to the primary for a
        # while, recorded before the client has the answer (and so before it can read).
        if request.method not in SAFE_METHODS and _is_api(request):
            user = getattr(request, "user", None)  # DRF's authenticated user, if any
            if user is not None and user.is_authenticated:
                record_write(user.pk)
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        routing = current_routing()
        match = request.resolver_match
        if (
            routing is not None
            and request.method in SAFE_METHODS
            and _is_api(request)
            and match is not None
            and match.url_name in READ_VIEWS
        ):
            routing.eligible = True
        return None

    def process_exception(self, request, exception):
        """A read on the replica failed (it stopped, or a query was cancelled by recovery)
        before the next health check noticed: answer the read again from the primary rather
        than with a 500. Safe to repeat: only GET and HEAD are ever routed."""
        routing = current_routing()
        if routing is None or routing.database != REPLICA or not isinstance(exception, DatabaseError):
            return None
        logger.warning("a read on the replica failed; answering from the primary (%s)", exception)
        replica_monitor().mark_failed()
        routing.fall_back_to_primary()
        match = request.resolver_match
        return match.func(request, *match.args, **match.kwargs)


def _is_api(request) -> bool:
    match = request.resolver_match
    return match is not None and match.route.startswith(API_ROUTE_PREFIX)
