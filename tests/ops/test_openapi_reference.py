"""The endpoint reference in the docs site is the schema the server serves: the committed
docs/reference/openapi.yaml is byte for byte the answer of GET /api/v1/schema, and
docs/reference/endpoints.md is its rendering (devtools/openapi_reference.py). A change to a
view, a serializer or a schema hook without `make openapi` fails here."""

import pytest
import yaml

from devtools import openapi_reference
from tests.conftest import client_for

STALE = "is stale: regenerate it with " + openapi_reference.REGENERATE


def test_the_committed_schema_is_what_the_server_serves():
    committed = openapi_reference.SCHEMA_FILE.read_bytes()
    assert openapi_reference.served_schema() == committed, f"docs/reference/openapi.yaml {STALE}"


@pytest.mark.django_db
def test_the_schema_view_through_the_whole_stack_answers_the_same_bytes():
    # served_schema() calls the view directly; a client request also runs the middleware.
    response = client_for(None).get(openapi_reference.SCHEMA_URL)
    assert response.status_code == 200
    assert response.content == openapi_reference.SCHEMA_FILE.read_bytes(), f"docs/reference/openapi.yaml {STALE}"


def test_the_endpoint_page_is_the_rendering_of_the_committed_schema():
    page = openapi_reference.markdown_page(openapi_reference.SCHEMA_FILE.read_bytes())
    assert openapi_reference.PAGE_FILE.read_text() == page, f"docs/reference/endpoints.md {STALE}"


def test_the_page_has_every_operation_and_every_schema():
    schema = yaml.safe_load(openapi_reference.SCHEMA_FILE.read_bytes())
    page = openapi_reference.PAGE_FILE.read_text()
    operations = [op for item in schema["paths"].values() for op in item.values() if "operationId" in op]
    assert len(operations) > 30
    assert not [op["operationId"] for op in operations if f"{{ #{op['operationId']} }}" not in page]
    names = schema["components"]["schemas"]
    assert not [n for n in names if f"{{ #{openapi_reference.schema_anchor(n)} }}" not in page]


def test_a_stale_file_is_reported_with_the_command_that_regenerates_it(tmp_path, monkeypatch):
    stale_copy = tmp_path / "openapi.yaml"
    stale_copy.write_bytes(openapi_reference.SCHEMA_FILE.read_bytes().replace(b"delaypay API", b"old API", 1))
    monkeypatch.setattr(openapi_reference, "SCHEMA_FILE", stale_copy)
    monkeypatch.setattr(openapi_reference, "PAGE_FILE", tmp_path / "missing.md")
    assert openapi_reference.stale() == [stale_copy, tmp_path / "missing.md"]
