from django.urls import path

from . import views

urlpatterns = [
    path("auth/token", views.TokenView.as_view(), name="auth-token"),
    path("accounts", views.AccountListCreateView.as_view(), name="account-list"),
    path("accounts/<str:account_id>", views.AccountDetailView.as_view(), name="account-detail"),
    path("accounts/<str:account_id>/deposits", views.DepositView.as_view(), name="account-deposits"),
    path("payments", views.PaymentListCreateView.as_view(), name="payment-list"),
    path("payments/<str:payment_id>", views.PaymentDetailView.as_view(), name="payment-detail"),
]
