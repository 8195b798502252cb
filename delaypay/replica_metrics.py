"""Metrics of the read replica (delaypay/db_router.py): which database served each API read,
and the replica's lag as this process last measured it.

Defined only where a replica is configured (the router imports this module); in
multiprocess mode each process writes its own values, /metrics sums the counter and shows
the gauges' most recent measurement by a live process (a process that never checked, a
Celery worker or a web process before its first API read, has none to show). Listed in
docs/how-to/read-replica.md.
"""

from prometheus_client import Counter, Gauge

api_reads_total = Counter(
    "delaypay_api_reads",
    "API read requests (GET and HEAD of payments, accounts, recurring payments and payees) by the database that "
    "served them (primary, replica) and why: replica_ok; recent_write (the user wrote within "
    "DELAYPAY_READ_YOUR_WRITES_SECONDS), no_write_record (the cache did not answer), replica_down, replica_lagging, "
    "replica_error (the replica failed during the request, which was then answered from the primary), anonymous.",
    ["database", "reason"],
)
replica_lag_seconds = Gauge(
    "delaypay_replica_lag_seconds",
    "How far the read replica's data is behind the primary, as this process last measured it (at most once per "
    "DELAYPAY_REPLICA_CHECK_SECONDS); 0 when it has replayed everything the primary had written, +Inf when it "
    "could not be measured (the replica or the primary did not answer).",
    multiprocess_mode="livemostrecent",
)
replica_usable = Gauge(
    "delaypay_replica_usable",
    "1 while API reads go to the replica (reachable, a standby, lag within DELAYPAY_REPLICA_MAX_LAG_SECONDS) "
    "at the most recent check, else 0.",
    multiprocess_mode="livemostrecent",
)

READ_REASONS = {
    "replica": ("replica_ok",),
    "primary": ("recent_write", "no_write_record", "replica_down", "replica_lagging", "replica_error", "anonymous"),
}
# Every series exported from the start (at 0), so rate() sees it before the first event.
for _database, _reasons in READ_REASONS.items():
    for _reason in _reasons:
        api_reads_total.labels(database=_database, reason=_reason)
