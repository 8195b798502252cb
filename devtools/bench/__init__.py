"""The due-time burst benchmark (``manage.py bench``): reusable pieces.

* ``stats``     percentiles and per-second series (pure functions)
* ``scratch``   fresh databases and a private Redis for one run, dropped afterwards
* ``loader``    set-based scenario loading (INSERT ... SELECT generate_series)
* ``check``     the correctness check run after every scenario
* ``measure``   lateness and drain figures from the database's own timestamps
* ``rss``       peak RSS per process type, sampled over each process tree
* ``pgbench``   the database's limit: one transfer per transaction, in C
* ``naive``     the naive Celery approach (one ETA task per payment), driver side
* ``naive_tasks`` its task; imported only by the benchmark's naive worker
* ``chart``     the PNG (matplotlib, imported lazily)
* ``compare``   runs of two checkouts side by side: a table and a chart (no database)
* ``profile``   py-spy around the workers, and a summary of where the time goes
* ``scenarios`` the scenarios themselves: burst, hot-sender, steady, backlog, memory

Nothing here is imported by the web, the promoter or the workers in production.
"""
