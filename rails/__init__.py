"""Payment rails: the gateways that move a payout from our ledger to an external payee.

``rails.base`` is the interface (``Rail`` and its outcomes) and ``get_rail``;
``rails.http`` talks to a gateway over HTTP; ``rails.sandbox`` is a stand-alone sandbox
gateway (stdlib only: this package imports nothing at import time, so
``python -m rails.sandbox`` never loads Django). The contract: docs/reference/rail-contract.md.
"""
