"""Development and verification tools: the burst benchmark, the fault-injection (chaos)
run, private PostgreSQL/Redis sandboxes, the process supervisor, data synthesis and
admin page timings.

It imports the product (``payments``, ``ledger``); the product never imports it.
"""
