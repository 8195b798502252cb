"""Fresh, private resources for one benchmark run, removed at the end.

Databases are created on the configured PostgreSQL server under names starting with
``delaypay_bench_`` and dropped afterwards; Redis is a private ``redis-server`` on a
spare loopback port, so a run never touches another database or Redis number.
"""

import os
import re
from contextlib import contextmanager

import psycopg
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql

PREFIX = "delaypay_bench_"
_NAME_OK = re.compile(r"^delaypay_bench_[a-z0-9_]{1,40}$")


def scratch_name(*parts: str) -> str:
    """``delaypay_bench_<parts>`` made of safe characters only."""
    name = PREFIX + "_".join(re.sub(r"[^a-z0-9]+", "_", p.lower()).strip("_") for p in parts if p)
    if not _NAME_OK.match(name):
        raise ValueError(f"bad scratch database name {name!r}")
    return name


def _server_params() -> dict:
    params = connection.get_connection_params()
    params["dbname"] = "postgres"
    return params


def server_version() -> str:
    """The PostgreSQL server's version, without needing the configured database to exist."""
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        return conn.execute("SHOW server_version").fetchone()[0]


def create_database(name: str) -> None:
    """Create ``name`` (dropping a leftover of the same name first)."""
    if not _NAME_OK.match(name):
        raise ValueError(f"refusing to create {name!r}: scratch names start with {PREFIX}")
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(name: str) -> None:
    """Drop a scratch database, ending any session still connected to it."""
    if not _NAME_OK.match(name):
        raise ValueError(f"refusing to drop {name!r}: only {PREFIX}* databases are dropped")
    with psycopg.connect(**_server_params(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def switch_database(name: str) -> None:
    """Point this process's default connection at ``name`` (as Django's test runner
    does with the test database); the Stack's children inherit it via DATABASE_URL."""
    connections["default"].close()
    connection.settings_dict["NAME"] = name


@contextmanager
def fresh_database(name: str, *, keep: bool = False):
    """Create, migrate and switch to ``name``; on exit switch back and drop it."""
    original = connection.settings_dict["NAME"]
    create_database(name)
    try:
        switch_database(name)
        call_command("migrate", interactive=False, verbosity=0)
        yield name
    finally:
        switch_database(original)
        if not keep:
            drop_database(name)


def pg_env() -> dict[str, str]:
    """Environment for libpq command-line tools (pgbench) reaching the same server."""
    db = connection.settings_dict
    env = dict(os.environ)
    env.update({
        "PGHOST": db.get("HOST") or "127.0.0.1",
        "PGPORT": str(db.get("PORT") or 5432),
        "PGUSER": db.get("USER") or "",
    })
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    # A multi-host URL (a failover pair) names the node to keep: the one taking writes.
    attrs = (db.get("OPTIONS") or {}).get("target_session_attrs")
    if attrs:
        env["PGTARGETSESSIONATTRS"] = attrs
    return env
