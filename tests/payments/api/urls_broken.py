"""A URLconf with a view that fails, to see Django's own 500 answer in the one error shape."""

from django.urls import include, path


def broken(request):
    raise RuntimeError("a bug")


urlpatterns = [
    path("api/v1/broken", broken),
    path("broken", broken),
    path("api/v1/", include("api.urls")),
]

handler500 = "api.errors.server_error"
