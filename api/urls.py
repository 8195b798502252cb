from django.urls import path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api import accounts, auth, deposits, payees, payments, recurring, webhooks


class PublicIdConverter:
    """Public ids (``pay_...``, ``acc_...``): anything else is a 404 before any view runs."""

    regex = "[A-Za-z0-9_]{1,64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(PublicIdConverter, "public_id")

urlpatterns = [
    path("auth/token", auth.TokenView.as_view(), name="auth-token"),
    path("auth/logout", auth.LogoutView.as_view(), name="auth-logout"),
    path("auth/logout-all", auth.LogoutAllView.as_view(), name="auth-logout-all"),
    path("accounts", accounts.AccountListCreateView.as_view(), name="account-list"),
    path("accounts/<public_id:account_id>", accounts.AccountDetailView.as_view(), name="account-detail"),
    path("accounts/<public_id:account_id>/deposits", accounts.DepositView.as_view(), name="account-deposits"),
    path(
        "accounts/<public_id:account_id>/payments",
        accounts.AccountPaymentListView.as_view(),
        name="account-payments",
    ),
    path(
        "accounts/<public_id:account_id>/transfers",
        accounts.AccountTransferListView.as_view(),
        name="account-transfers",
    ),
    path("deposit-requests", deposits.DepositRequestListView.as_view(), name="deposit-request-list"),
    path(
        "deposit-requests/<public_id:request_id>",
        deposits.DepositRequestDetailView.as_view(),
        name="deposit-request-detail",
    ),
    path(
        "deposit-requests/<public_id:request_id>/approve",
        deposits.DepositRequestApproveView.as_view(),
        name="deposit-request-approve",
    ),
    path(
        "deposit-requests/<public_id:request_id>/reject",
        deposits.DepositRequestRejectView.as_view(),
        name="deposit-request-reject",
    ),
    path("payees", payees.PayeeListCreateView.as_view(), name="payee-list"),
    path("payees/<public_id:payee_id>", payees.PayeeDetailView.as_view(), name="payee-detail"),
    path("payments", payments.PaymentListCreateView.as_view(), name="payment-list"),
    path("payments/<public_id:payment_id>", payments.PaymentDetailView.as_view(), name="payment-detail"),
    path(
        "payments/<public_id:payment_id>/redrive", payments.PaymentRedriveView.as_view(), name="payment-redrive"
    ),
    path(
        "payments/<public_id:payment_id>/resolve", payments.PaymentResolveView.as_view(), name="payment-resolve"
    ),
    path("recurring-payments", recurring.RecurringListCreateView.as_view(), name="recurring-list"),
    path(
        "recurring-payments/<public_id:recurring_id>",
        recurring.RecurringDetailView.as_view(),
        name="recurring-detail",
    ),
    path(
        "recurring-payments/<public_id:recurring_id>/pause",
        recurring.RecurringPauseView.as_view(),
        name="recurring-pause",
    ),
    path(
        "recurring-payments/<public_id:recurring_id>/resume",
        recurring.RecurringResumeView.as_view(),
        name="recurring-resume",
    ),
    path("webhook-endpoints", webhooks.EndpointListCreateView.as_view(), name="webhook-endpoint-list"),
    path(
        "webhook-endpoints/<public_id:endpoint_id>",
        webhooks.EndpointDetailView.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhook-endpoints/<public_id:endpoint_id>/rotate-secret",
        webhooks.EndpointRotateSecretView.as_view(),
        name="webhook-endpoint-rotate-secret",
    ),
    path(
        "webhook-endpoints/<public_id:endpoint_id>/deliveries",
        webhooks.DeliveryListView.as_view(),
        name="webhook-delivery-list",
    ),
    path(
        "webhook-endpoints/<public_id:endpoint_id>/deliveries/<public_id:delivery_id>/resend",
        webhooks.DeliveryResendView.as_view(),
        name="webhook-delivery-resend",
    ),
    # GET and HEAD only, as every API view (base.ApiView): DRF's OPTIONS on the Swagger page
    # rendered a template that does not exist (a 500).
    path("schema", SpectacularAPIView.as_view(http_method_names=["get", "head"]), name="schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="schema", http_method_names=["get", "head"]), name="docs"),
]
