from django.contrib import admin
from django.urls import include, path

from console.admin_limits import limits_view
from console.dashboard import dashboard_view
from console.search import search_view
from delaypay import views
from delaypay.favicon import favicon

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),  # browsers ask every page for it
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/limits/", admin.site.admin_view(limits_view), name="admin-limits"),
    path("admin/search/", admin.site.admin_view(search_view), name="admin-search"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
]

handler400 = "api.errors.bad_request"
handler403 = "delaypay.views.permission_denied"
handler404 = "api.errors.not_found"
handler500 = "api.errors.server_error"
