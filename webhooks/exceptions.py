"""The webhooks' domain errors, each with a stable ``code`` (api/errors.py maps them to
HTTP statuses with the others)."""

from payments.exceptions import DomainError, StaffActionForbidden, VersionMismatch


class EndpointNotFound(DomainError):
    code = "not_found"
    default_detail = "No such webhook endpoint."


class DeliveryNotFound(DomainError):
    code = "not_found"
    default_detail = "No such delivery of this webhook endpoint."


class EndpointActForbidden(StaffActionForbidden):
    default_detail = (
        "Only the endpoint's owner may change it, delete it, rotate its secret or resend its deliveries "
        "(staff resend from the admin)."
    )


class EndpointLimit(DomainError):
    code = "limit_webhook_endpoints"

    def __init__(self, *, limit: int, usage: int):
        super().__init__(
            f"You have {usage} webhook endpoints, the most one user may have; delete one first.",
            limit=limit,
            usage=usage,
        )


class EndpointVersionMismatch(VersionMismatch):
    def __init__(self, version: int):
        DomainError.__init__(self, "The endpoint changed since you read it (If-Match does not match).", version=version)
        self.version = version
