"""The OpenAPI schema and the Swagger UI: served without a token, valid, complete."""

import json
from datetime import timedelta

import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone

from api import urls as api_urls
from tests.api import assert_error, patch, post
from tests.conftest import client_for
from tests.factories import funded_account, future_payment, webhook_endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema():
    response = client_for(None).get("/api/v1/schema", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_the_schema_is_served_anonymously_as_openapi_3(db):
    response = client_for(None).get("/api/v1/schema")
    assert response.status_code == 200
    assert yaml.safe_load(response.content)["openapi"].startswith("3.")


def test_the_schema_validates_without_warnings(tmp_path):
    # The same check as `manage.py spectacular --validate --fail-on-warn` (see the Makefile).
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


def test_every_api_route_is_in_the_schema(schema):
    routes = {str(p.pattern) for p in api_urls.urlpatterns} - {"schema", "docs"}
    documented = {p.removeprefix("/api/v1/").replace("{", "<public_id:").replace("}", ">") for p in schema["paths"]}
    assert documented == routes


def test_every_error_response_is_the_error_shape(schema):
    for path, method, operation in operations(schema):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/Error", (path, method, status)
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"code", "detail"}
    assert {"fields", "status", "retry_after"} <= set(error["properties"])


def test_every_authenticated_operation_documents_401_and_its_other_errors(schema):
    for path, method, operation in operations(schema):
        statuses = set(operation["responses"])
        if path == "/api/v1/auth/token":
            assert operation.get("security") in (None, [])
            assert "401" not in statuses
            continue
        assert operation["security"] == [{"tokenAuth": []}], (path, method)
        assert "401" in statuses, (path, method)
        if "requestBody" in operation:
            assert {"400", "413", "415"} <= statuses, (path, method)
        if "{" in path:
            assert "404" in statuses, (path, method)


def test_idempotent_creates_require_the_idempotency_key_header(schema):
    creates = {(p, m) for p, m, _ in operations(schema) if m == "post"}
    keyed = {
        (p, m)
        for p, m, o in operations(schema)
        for param in o.get("parameters", [])
        if param["in"] == "header" and param["name"] == "Idempotency-Key" and param["required"]
    }
    assert keyed == {
        ("/api/v1/payments", "post"),
        ("/api/v1/payees", "post"),
        ("/api/v1/accounts/{account_id}/deposits", "post"),
        ("/api/v1/recurring-payments", "post"),
        ("/api/v1/webhook-endpoints", "post"),
        # A secret is created: a retried rotation must replay, not rotate twice.
        ("/api/v1/webhook-endpoints/{endpoint_id}/rotate-secret", "post"),
    }
    assert creates > keyed
    for path, method in keyed:
        responses = schema["paths"][path][method]["responses"]
        success = min(status for status in responses if status.startswith("2"))  # 201, or 200 for a rotation
        assert "Idempotent-Replayed" in responses[success]["headers"]
        assert "Retry-After" in responses["429"]["headers"]


def test_the_docs_page_serves_swagger_ui_from_our_own_static_files():
    client = client_for(None)
    page = client.get("/api/v1/docs")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle" in html
    assert "cdn." not in html and "unpkg" not in html
    assert "/api/v1/schema" in html
    start = html.index("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle")
    asset = html[start : html.index('"', start)]
    response = client.get(asset)
    assert response.status_code == 200
    assert b"SwaggerUIBundle" in b"".join(response.streaming_content)


def test_every_versioned_resource_documents_its_etag_and_every_write_on_it_if_match_and_412(schema):
    for path in ("/api/v1/payments/{payment_id}", "/api/v1/recurring-payments/{recurring_id}"):
        for method, operation in schema["paths"][path].items():
            assert "ETag" in operation["responses"]["200"]["headers"], (path, method)
    writes = [
        ("/api/v1/payments/{payment_id}", "patch"),
        ("/api/v1/recurring-payments/{recurring_id}", "patch"),
        ("/api/v1/recurring-payments/{recurring_id}", "delete"),
        ("/api/v1/recurring-payments/{recurring_id}/pause", "post"),
        ("/api/v1/recurring-payments/{recurring_id}/resume", "post"),
    ]
    for path, method in writes:
        operation = schema["paths"][path][method]
        headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
        assert not headers["If-Match"].get("required", False), (path, method)
        assert {"400", "412"} <= set(operation["responses"]), (path, method)


# --- the schema says what the server does (issue 33) -----------------------------------------


def component(schema, ref: str) -> dict:
    return schema["components"]["schemas"][ref.removeprefix("#/components/schemas/")]


def test_every_operation_documents_the_http_servers_414_and_431(schema):
    """Gunicorn answers an over-long request line (414) and an over-large header (431)
    before any view, on every path (delaypay/gunicorn_config.py), in the Error shape."""
    for path, method, operation in operations(schema):
        for status, code in (("414", "uri_too_long"), ("431", "header_too_large")):
            response = operation["responses"].get(status)
            assert response is not None, (path, method, status)
            assert response["description"].startswith(f"{code}: from the HTTP server"), (path, method, status)


def request_bodies(schema):
    for path, method, operation in operations(schema):
        if "requestBody" in operation:
            (media,) = operation["requestBody"]["content"].values()
            yield path, method, component(schema, media["schema"]["$ref"])


def test_every_request_body_refuses_unknown_fields_in_the_schema_as_on_the_server(schema, user):
    for path, method, body in request_bodies(schema):
        assert body["type"] == "object" and body["additionalProperties"] is False, (path, method)
    # The server: an unknown field is a validation_error naming it (one create per kind of body).
    response = post(client_for(user), "/api/v1/accounts", {"name": "mine", "colour": "blue"})
    assert assert_error(response, 400, "validation_error")["fields"] == {"colour": ["Unknown field."]}


PATCHES = {
    "/api/v1/payments/{payment_id}": lambda user: future_payment(
        source=funded_account(owner=user, balance=10), target=funded_account()
    ).id,
    "/api/v1/recurring-payments/{recurring_id}": lambda user: recurring_for(user).id,
    "/api/v1/webhook-endpoints/{endpoint_id}": lambda user: webhook_endpoint(user).id,
}


def recurring_for(user):
    from payments.models import RecurringPayment

    tomorrow = timezone.now() + timedelta(days=1)
    return RecurringPayment.objects.create(
        payer=user, from_account=funded_account(owner=user, balance=10), to_account=funded_account(), amount=1,
        start_at=tomorrow, interval="P1D", next_occurrence_at=tomorrow,
    )


def test_a_patch_body_needs_a_field_in_the_schema_as_on_the_server(schema, user):
    """PATCH {} changes nothing and is refused (400 validation_error): the schema says
    minProperties 1, so a client reading it does not send one."""
    patched = {path: body for path, method, body in request_bodies(schema) if method == "patch"}
    assert set(patched) == set(PATCHES)
    api = client_for(user)
    for path, body in patched.items():
        assert body["minProperties"] == 1 and not body.get("required"), path
        url = path.replace(path[path.index("{"):], PATCHES[path](user))
        assert "non_field_errors" in assert_error(patch(api, url, {}), 400, "validation_error")["fields"], path


def path_parameters(operation) -> set[str]:
    return {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}


def test_each_create_links_to_the_operations_on_what_it_made(schema):
    """OpenAPI links (api/schema.py, LINKS): from the create's answer to the
    operations on the resource, each path parameter taken from a field the answer always has."""
    by_id = {operation["operationId"]: operation for _, _, operation in operations(schema)}
    linked = {}
    for _, _, operation in operations(schema):
        for response in operation["responses"].values():
            for name, link in response.get("links", {}).items():
                target = by_id[link["operationId"]]
                assert set(link["parameters"]) == path_parameters(target), name
                answer = component(schema, response["content"]["application/json"]["schema"]["$ref"])
                for expression in link["parameters"].values():
                    field = expression.removeprefix("$response.body#/")
                    assert field in answer["properties"] and field in answer["required"], (name, field)
                linked.setdefault(operation["operationId"], set()).add(link["operationId"])
    # At least: create payment -> get, cancel; create payee -> delete; create endpoint -> get,
    # delete; create recurring payment -> get, pause.
    assert {"payments_retrieve", "payments_cancel"} <= linked["payments_create"]
    assert {"payees_delete"} <= linked["payees_create"]
    assert {"webhook_endpoints_retrieve", "webhook_endpoints_delete"} <= linked["webhook_endpoints_create"]
    assert {"recurring_payments_retrieve", "recurring_payments_pause"} <= linked["recurring_payments_create"]
