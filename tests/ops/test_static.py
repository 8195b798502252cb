"""Production mode (DJANGO_DEBUG=0, as the tests run): the admin links hashed static files
and WhiteNoise serves them from STATIC_ROOT, so staff never see an unstyled console."""

import re

import pytest

from tests.conftest import admin_client_for


@pytest.mark.django_db
def test_admin_stylesheet_is_served_by_whitenoise(superuser, settings):
    assert not settings.DEBUG
    client = admin_client_for(superuser)
    html = client.get("/admin/").content.decode()
    href = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', html).group(1)
    response = client.get(href)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
    assert "max-age=315360000" in response["Cache-Control"]  # hashed name: cached for good
    assert b"--body-fg" in b"".join(response.streaming_content)
