"""Payment rails: the gateways that move a payout from our ledger to an external payee.

``rails.base`` is the interface (``RailClient`` and its outcomes) and ``RAIL_NAMES``, the
one list of rails: the payees' choices and CHECK and the metrics' labels derive from it.
``rails.registry`` builds each named rail (``get_rail``);
``rails.http`` talks to a gateway over HTTP; ``rails.sandbox`` is a stand-alone sandbox
gateway (stdlib only: this package imports nothing at import time, so
``python -m rails.sandbox`` never loads Django). The contract: docs/reference/rail-contract.md.
"""
