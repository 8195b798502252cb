"""Which database the current request reads from, for the code below the project's
configuration that must know it (the API's exception handler): delaypay/db_router.py
decides and sets it, this module only holds it. A context variable, so each request
(thread or task) has its own."""

import contextvars

REPLICA = "replica"

_routing: contextvars.ContextVar = contextvars.ContextVar("delaypay_read_routing", default=None)


def current_routing():
    """This request's ``delaypay.db_router.ReadRouting``, or None outside a routed request."""
    return _routing.get()


def set_routing(routing) -> contextvars.Token:
    return _routing.set(routing)


def reset_routing(token: contextvars.Token) -> None:
    _routing.reset(token)
