"""Payment reads, scoped to who may see what."""

from django.db.models import Prefetch, Q, QuerySet

from .exceptions import PaymentNotFound
from .models import ExecutionAttempt, ScheduledPayment


def payment_visible_to(*, user) -> QuerySet[ScheduledPayment]:
    """Payments a user may read and cancel: those they created or that debit an account
    they own. Staff see every payment."""
    qs = ScheduledPayment.objects.all()
    if user.is_staff:
        return qs
    return qs.filter(Q(payer=user) | Q(from_account__owner=user))


def payment_get(*, user, payment_id: str) -> ScheduledPayment:
    """One payment with its attempts; PaymentNotFound when it is not the user's to see
    (not 403: existence is not revealed)."""
    payment = (
        payment_visible_to(user=user)
        .prefetch_related(Prefetch("attempts", queryset=ExecutionAttempt.objects.order_by("attempt")))
        .filter(pk=payment_id)
        .first()
    )
    if payment is None:
        raise PaymentNotFound()
    return payment
