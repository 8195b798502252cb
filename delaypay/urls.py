from django.contrib import admin
from django.urls import include, path

from delaypay import views
from delaypay.favicon import favicon
from payments.admin_limits import limits_view
from payments.dashboard import dashboard_view

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),  # browsers ask every page for it
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/limits/", admin.site.admin_view(limits_view), name="admin-limits"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("payments.api.urls")),
]

handler400 = "payments.api.errors.bad_request"
handler403 = "payments.api.errors.permission_denied"
handler404 = "payments.api.errors.not_found"
handler500 = "payments.api.errors.server_error"
