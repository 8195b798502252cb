"""OpenAPI pieces shared by the views: the one error shape, the error responses each
operation can give, the Idempotency-Key header and the page envelope."""

from functools import cache

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers

from api.errors import ERROR_CODE_CHOICES
from ledger.models import DepositRequest
from payments.models import PaymentStatus, RecurringStatus

# The `status` of a 409: a payment's, a recurring payment's or a deposit request's.
ERROR_STATUS_CHOICES = [*PaymentStatus.choices, *RecurringStatus.choices, *DepositRequest.Status.choices]


class ErrorSerializer(serializers.Serializer):
    """Every 4xx and 5xx body: `code` is stable and machine-readable, `detail` is for people."""

    def get_fields(self):
        # "fields" cannot be a declared attribute: it would shadow Serializer.fields.
        return {
            "code": serializers.ChoiceField(choices=ERROR_CODE_CHOICES, help_text="Stable snake_case error code."),
            "detail": serializers.CharField(help_text="A human sentence; may change."),
            "fields": serializers.DictField(
                child=serializers.ListField(child=serializers.CharField()),
                required=False,
                help_text="validation_error only: messages per field (body field, query parameter or header).",
            ),
            "status": serializers.ChoiceField(
                choices=ERROR_STATUS_CHOICES,
                required=False,
                help_text="payment_not_cancellable, payment_not_editable, payment_not_in_review, "
                "recurring_not_editable and deposit_request_not_pending: the current status of the payment, "
                "recurring payment or deposit request.",
            ),
            "version": serializers.IntegerField(
                required=False, min_value=1, help_text="version_mismatch only: the current version (its ETag)."
            ),
            "retry_after": serializers.IntegerField(
                required=False,
                min_value=1,
                help_text="throttled and login_locked_out: seconds to wait, as Retry-After.",
            ),
            "limit": serializers.IntegerField(
                required=False, min_value=1, help_text="limit_* only: the per-user limit that would be passed."
            ),
            "usage": serializers.IntegerField(
                required=False, min_value=0, help_text="limit_* only: where you stand against it before this request."
            ),
            "requested": serializers.IntegerField(
                required=False, min_value=0, help_text="limit_daily_outflow only: the units this request adds."
            ),
            "day": serializers.DateField(
                required=False, help_text="limit_daily_outflow only: the UTC day that would go over the limit."
            ),
        }


_WHEN = {
    400: "Invalid request: validation_error (with `fields`), parse_error, an idempotency_key_* code, or "
    "system_account (a payment into a system account).",
    401: "not_authenticated: missing or invalid token.",
    403: "permission_denied.",
    404: "not_found: no such resource, or not yours (existence is not revealed).",
    406: "not_acceptable: the Accept header excludes application/json.",
    409: "A conflict; see `code`.",
    410: "payment_archived: the id falls in a month that was archived (DELAYPAY_RETENTION_DAYS); "
    "`archived_month` says which.",
    412: "version_mismatch: If-Match names a version other than the current one, given in `version`.",
    413: "payload_too_large: the body is over 64 KiB.",
    415: "unsupported_media_type: the body must be application/json, with at most a charset parameter.",
    429: "throttled: retry after `retry_after` seconds (also the Retry-After header).",
}


def errors(*statuses: int, **descriptions: str) -> dict[int, OpenApiResponse]:
    """Error responses for ``statuses``; ``descriptions`` (``e409="..."``) override the defaults."""
    return {
        status: OpenApiResponse(ErrorSerializer, description=descriptions.get(f"e{status}", _WHEN[status]))
        for status in sorted(statuses)
    }


READ = (401, 406)  # every authenticated operation
WRITE = (400, 401, 406, 413, 415)  # every operation with a JSON body

RETRY_AFTER = OpenApiParameter(
    "Retry-After", int, OpenApiParameter.HEADER, response=[429], description="Seconds to wait before retrying."
)
WWW_AUTHENTICATE = OpenApiParameter(
    "WWW-Authenticate", str, OpenApiParameter.HEADER, response=[401], description="`Token` challenge."
)

ETAG = OpenApiParameter(
    "ETag",
    str,
    OpenApiParameter.HEADER,
    response=[200],
    description='The version as an entity tag, `"<version>"`: send it back in If-Match to make a change optimistic.',
)
IF_MATCH = OpenApiParameter(
    "If-Match",
    str,
    OpenApiParameter.HEADER,
    required=False,
    pattern=r'^(\*|(W/)?"[0-9]+"([ \t]*,[ \t]*(W/)?"[0-9]+")*)$',
    description=(
        'Optional precondition: the ETag you read (`"3"`; `W/"3"` is the same version; several may be '
        "listed; `*` matches any). If the version changed since, the change is refused with 412 "
        "version_mismatch and nothing changes. A retry of a change that already took effect succeeds "
        "whatever version it names. Anything that is not entity tags is 400 validation_error."
    ),
)

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=True,
    # Bare form, no comma; the quoted form ("...", an RFC 8941 string) is accepted too.
    pattern=r"^[!#-+\x2d-~](?:[ -+\x2d-~]{0,253}[!#-+\x2d-~])?$",
    description=(
        "1-255 printable ASCII characters, bare or in double quotes, unique per request you mean "
        "to make once (a UUID is a good choice). Scoped to your user and kept at least 24 hours. "
        "Send it once: a bare key may not contain a comma, because a header sent twice arrives "
        "joined by one (400 idempotency_key_repeated). "
        "Repeating a request with the same key and the same body replays the first response "
        "byte for byte with `Idempotent-Replayed: true` and creates nothing; the same key with a "
        "different body is 409 idempotency_key_reused; while the first is still running, 409 "
        "idempotency_key_in_use. A request rejected with 4xx stores nothing: fix it and reuse the key."
    ),
)
IDEMPOTENT_REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    enum=["true"],
    response=[201, 202],
    description="Present on a replayed response.",
)


@cache  # one component per name, however many operations use it
def page_of(serializer_class, name: str):
    """The list envelope: ``{"items": [...], "next_cursor": "<opaque>" | null}``."""
    return inline_serializer(
        name=name,
        fields={
            "items": serializer_class(many=True),
            "next_cursor": serializers.CharField(
                allow_null=True, help_text="Pass as `cursor` for the next page; null on the last page."
            ),
        },
    )


# --- request bodies as the server takes them, and the links between operations -------------


def _from_body(name: str) -> dict[str, str]:
    return {name: f"$response.body#/{name}"}


# OpenAPI links from each create's answer to the operations on what it made (drf-spectacular
# cannot infer them): clients (and schemathesis's stateful phase) follow the id they got
# back. (operationId, status) -> {link name: (operationId, parameters, description)}.
LINKS = {
    ("accounts_create", "201"): {
        "GetAccount": ("accounts_retrieve", _from_body("account_id"), "The account just opened."),
        "ListAccountPayments": ("accounts_payments_list", _from_body("account_id"), "Its payments."),
        "ListAccountTransfers": ("accounts_transfers_list", _from_body("account_id"), "Its transfers."),
        "DepositIntoAccount": ("accounts_deposits_create", _from_body("account_id"), "Staff: deposit into it."),
    },
    ("accounts_deposits_create", "202"): {
        "GetDepositRequest": ("deposit_requests_retrieve", _from_body("request_id"), "The request just made."),
        "ApproveDepositRequest": ("deposit_requests_approve", _from_body("request_id"), "Another staff member."),
        "RejectDepositRequest": ("deposit_requests_reject", _from_body("request_id"), "Another staff member."),
    },
    ("payees_create", "201"): {
        "GetPayee": ("payees_retrieve", _from_body("payee_id"), "The payee just added."),
        "DeletePayee": ("payees_delete", _from_body("payee_id"), "Hide it (nothing pending to it)."),
    },
    ("payments_create", "201"): {
        "GetPayment": ("payments_retrieve", _from_body("payment_id"), "The payment just scheduled."),
        "UpdatePayment": ("payments_update", _from_body("payment_id"), "Reschedule it while it is SCHEDULED."),
        "CancelPayment": ("payments_cancel", _from_body("payment_id"), "Cancel it while it is SCHEDULED."),
    },
    ("recurring_payments_create", "201"): {
        "GetRecurringPayment": ("recurring_payments_retrieve", _from_body("recurring_id"), "The series just made."),
        "UpdateRecurringPayment": ("recurring_payments_update", _from_body("recurring_id"), "Change its terms."),
        "PauseRecurringPayment": ("recurring_payments_pause", _from_body("recurring_id"), "Pause it."),
        "ResumeRecurringPayment": ("recurring_payments_resume", _from_body("recurring_id"), "Resume it."),
        "EndRecurringPayment": ("recurring_payments_end", _from_body("recurring_id"), "End it."),
    },
    ("webhook_endpoints_create", "201"): {
        "GetWebhookEndpoint": ("webhook_endpoints_retrieve", _from_body("endpoint_id"), "The endpoint just made."),
        "UpdateWebhookEndpoint": ("webhook_endpoints_update", _from_body("endpoint_id"), "Change it."),
        "DeleteWebhookEndpoint": ("webhook_endpoints_delete", _from_body("endpoint_id"), "Delete it."),
        "RotateWebhookEndpointSecret": (
            "webhook_endpoints_rotate_secret", _from_body("endpoint_id"), "Rotate its secret.",
        ),
        "ListWebhookEndpointDeliveries": ("webhook_endpoints_deliveries", _from_body("endpoint_id"), "Its deliveries."),
    },
}


def add_links(result, generator, request, public):
    """drf-spectacular postprocessing hook: LINKS on the answers of the creates. An
    operationId that is not in the schema is an error here, not a dangling link."""
    operations = {
        operation["operationId"]: operation
        for item in result.get("paths", {}).values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    missing = {target for links in LINKS.values() for target, _, _ in links.values()} - set(operations)
    missing |= {source for source, _ in LINKS} - set(operations)
    if missing:
        raise ValueError(f"links name operations the schema does not have: {sorted(missing)}")
    for (source, status), links in LINKS.items():
        operations[source]["responses"][status]["links"] = {
            name: {"operationId": target, "parameters": parameters, "description": description}
            for name, (target, parameters, description) in links.items()
        }
    return result
