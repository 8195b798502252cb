"""Helpers the domain apps share (ids, admin widgets, broker probes).

Nothing here imports the project package (``delaypay``), ``payments`` or ``ledger``:
``ledger`` and ``payments`` import from here, never the other way round.
"""
